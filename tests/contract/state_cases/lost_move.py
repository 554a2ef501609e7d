"""A node lost or re-registered while one of its jobs is moving to or from another node, written once against
the store interface: ``tests/contract/test_state_store.py`` runs the cases on ``MemoryState`` and on
``RedisState`` (``lua/node.lua``).

The job is re-queued, as every job of a lost node is. Its copy on the other node may run there still: the
target of the move once that node applied the ``migrate_start``, or the source until its ``migrate_stop``. So
the state holds that copy's instance ``retiring`` with the job (its slices taken, never offered to another
placement) and names it in ``stops`` with its node, for the node registry to send that node a ``stop`` of that
run only; the node's confirmation (``node_stopped``) idles it. Idling it at once let the balancer place another
job on slices the node still used: that placement failed on the node and was retried."""

from __future__ import annotations

from typing import Any

from tests.contract.state_cases.late_run import NOW, clean, gpu, held
from tests.contract.state_cases.migration_exit import moving_away


async def stopped_there(store: Any, node: str, job: str, gpu_id: str, instance_id: str) -> None:
    """``node`` confirms it stopped ``job``: the instance held for it idles."""
    assert (await store.node_stopped(node, job, NOW + 5))["gpus"] == [gpu_id]
    assert await held(store, gpu_id) == [(instance_id, "idle", None)]
    await clean(store)


async def losing_the_source_node_during_a_move_holds_the_target_until_its_node_stops_the_copy(store: Any) -> None:
    _, dst = await moving_away(store, "k1")
    res = await store.node_lost("n1", NOW + 1, "node n1 missed heartbeats")
    assert res["requeued"] == ["k1"]
    assert [tuple(s) for s in res["stops"]] == [("k1", "n2/0", dst.id, "n2")]
    assert (await store.job("k1")).state == "pending"
    assert await held(store, "n2/0") == [(dst.id, "retiring", "k1")]
    await clean(store)
    await stopped_there(store, "n2", "k1", "n2/0", dst.id)


async def losing_the_target_node_during_a_move_holds_the_source_until_its_node_stops_the_copy(store: Any) -> None:
    src, _ = await moving_away(store, "k2")
    res = await store.node_lost("n2", NOW + 1, "node n2 missed heartbeats")
    assert res["requeued"] == ["k2"]
    assert [tuple(s) for s in res["stops"]] == [("k2", "n1/0", src.id, "n1")]
    assert (await store.job("k2")).state == "pending"
    assert await held(store, "n1/0") == [(src.id, "retiring", "k2")]
    assert await held(store, "n2/0") == []
    await clean(store)
    await stopped_there(store, "n1", "k2", "n1/0", src.id)


async def a_source_node_registering_without_the_moving_copy_holds_the_target_on_the_other_node(
    store: Any,
) -> None:
    _, dst = await moving_away(store, "k3")
    res = await store.register_node("n1", [gpu(0)], NOW + 1, "reg-2")  # restarted: the source copy is gone
    assert res["requeued"] == ["k3"]
    assert [tuple(s) for s in res["stops"]] == [("k3", "n2/0", dst.id, "n2")]
    assert await held(store, "n1/0") == []  # not reported: it does not exist there
    assert await held(store, "n2/0") == [(dst.id, "retiring", "k3")]
    await clean(store)
    await stopped_there(store, "n2", "k3", "n2/0", dst.id)


CASES = [
    losing_the_source_node_during_a_move_holds_the_target_until_its_node_stops_the_copy,
    losing_the_target_node_during_a_move_holds_the_source_until_its_node_stops_the_copy,
    a_source_node_registering_without_the_moving_copy_holds_the_target_on_the_other_node,
]
