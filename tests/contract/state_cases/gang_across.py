"""Scenarios of gangs across nodes in the state store, run on ``MemoryState`` and on ``RedisState`` (the Lua
scripts) by ``tests/contract/test_state_store.py``.

Three nodes ``a``, ``b`` and ``c``, each with two GPUs not in MIG mode. The gang ``g`` takes ``a/0 a/1 b/0``:
every slot is reserved in one step or none is; each member node starts and ends its own part; the first end
that is not a completion ends the job and holds the other parts until their nodes confirm a stop.
"""

from __future__ import annotations

from typing import Any

from shared.mig.geometry import default_geometry
from shared.state import Reservation, SlotReservation, StoredInstance, audit

GEO = default_geometry()
NOW = 1000.0
GANG = ("a/0", "a/1", "b/0")


def node_gpus(node: str) -> list[dict[str, Any]]:
    return [
        {"id": f"{node}/{i}", "index": i, "model": "A100-40GB", "mig": False, "healthy": True,
         "uuid": f"GPU-{node}-{i}", "instances": [], "replicas": 0, "jobs": []}
        for i in range(2)
    ]


async def setup(store: Any) -> None:
    for node in ("a", "b", "c"):
        await store.register_node(node, node_gpus(node), NOW, "", f"{node}.example")


def whole(gpu: str, job: str) -> StoredInstance:
    return StoredInstance(id=f"{gpu}:gpu@0:{job}", profile="gpu", start=0, size=8, compute=7, mig=False)


async def reserve(store: Any, job: str = "g", gpus: tuple[str, ...] = GANG, span: bool = True,
                  stale: str = "") -> Any:
    vers = [g.ver for g in await store.get_gpus(list(gpus))]
    slots = [SlotReservation(gpu_id=g, expected_ver=v - (g == stale), instance=whole(g, job), max_count=1)
             for g, v in zip(gpus, vers, strict=True)]
    first = slots[0]
    return await store.reserve(
        Reservation(job_id=job, gpu_id=first.gpu_id, expected_ver=first.expected_ver, instance=first.instance,
                    action="create", max_count=1, extra=tuple(slots[1:]), span=span, track=True, spec=b"{}",
                    submitted_at=NOW),
        NOW,
    )


async def holders(store: Any) -> dict[str, list[tuple[str, str]]]:
    """GPU id -> (job, state) of each instance on it."""
    gpus = await store.get_gpus([f"{n}/{i}" for n in "abc" for i in range(2)])
    return {g.id: [(i.job or "", i.state) for i in g.instances] for g in gpus if g is not None}


async def clean(store: Any) -> None:
    assert [str(v) for v in await audit(store, GEO)] == []


async def started(store: Any, job: str = "g") -> None:
    """Both member nodes report their place command done."""
    assert await store.mark_running(job, "", NOW + 1, "place:g:0/0", 0, "a") == "ok"
    assert await store.mark_running(job, "", NOW + 1, "place:g:0/1", 0, "b") == "ok"


async def a_gang_across_nodes_reserves_every_gpu_in_one_step_and_tracks_a_command_per_node(store: Any) -> None:
    await setup(store)
    res = await reserve(store)
    assert res.ok and res.master_addr == "a.example"
    job = await store.job("g")
    assert job.state == "placing" and [g for g, _ in job.slots] == list(GANG) and job.node == "a"
    cmds = await store.commands(0)
    assert {cid: (c["node"], c["gpu"]) for cid, c in cmds.items()} == {
        "place:g:0/0": ("a", "a/0"), "place:g:0/1": ("b", "b/0")}
    await clean(store)


async def without_span_a_reservation_across_nodes_is_refused_and_nothing_is_held(store: Any) -> None:
    await setup(store)
    res = await reserve(store, span=False)
    assert res.status == "node"
    assert await store.job("g") is None
    assert all(v == [] for v in (await holders(store)).values())


async def a_stale_version_on_any_node_aborts_the_whole_gang(store: Any) -> None:
    await setup(store)
    assert (await reserve(store, stale="b/0")).status == "conflict"
    assert await store.job("g") is None and all(v == [] for v in (await holders(store)).values())
    assert (await store.commands(0)) == {}


async def the_gang_runs_only_once_every_member_node_started(store: Any) -> None:
    await setup(store)
    await reserve(store)
    assert await store.mark_running("g", "", NOW + 1, "place:g:0/0", 0, "a") == "ok"
    assert (await store.job("g")).state == "placing"
    h = await holders(store)
    assert h["a/0"] == [("g", "busy")] and h["b/0"] == [("g", "reserved")]
    await clean(store)
    assert await store.mark_running("g", "", NOW + 2, "place:g:0/1", 0, "b") == "ok"
    assert (await store.job("g")).state == "running"
    assert (await store.commands(0)) == {}
    await clean(store)


async def a_member_that_completes_frees_its_gpus_and_the_last_one_finishes_the_job(store: Any) -> None:
    await setup(store)
    await reserve(store)
    await started(store)
    part = await store.release("g", "completed", "done", NOW + 5, "b/0:gpu@0:g")
    assert part.status == "member" and part.slots == (("b/0", "b/0:gpu@0:g"),)
    assert (await store.job("g")).state == "running"
    assert (await holders(store))["b/0"] == []
    again = await store.release("g", "completed", "done", NOW + 5, "b/0:gpu@0:g")  # redelivered: nothing more
    assert again.status == "noop" and (await store.job("g")).state == "running"
    await clean(store)
    last = await store.release("g", "completed", "done", NOW + 6, "a/0:gpu@0:g")
    assert last.status == "ok" and last.state == "finished" and last.stops == ()
    assert all(v == [] for v in (await holders(store)).values())
    await clean(store)


async def the_first_failed_member_ends_the_job_and_holds_the_others_until_they_stop(store: Any) -> None:
    await setup(store)
    await reserve(store)
    await started(store)
    res = await store.release("g", "failed", "exit 1", NOW + 5, "b/0:gpu@0:g")
    assert res.status == "ok" and res.state == "failed"
    assert res.stops == (("a", "a/0", "a/0:gpu@0:g"),)
    assert res.slots == (("b/0", "b/0:gpu@0:g"),)  # what this exit freed
    h = await holders(store)
    assert h["b/0"] == [] and h["a/0"] == [("g", "retiring")] and h["a/1"] == [("g", "retiring")]
    await clean(store)
    late = await store.release("g", "cancelled", "stopped", NOW + 6, "a/0:gpu@0:g")  # the stopped part's exit
    assert late.status == "noop"
    assert set((await store.node_stopped("a", "g", NOW + 6))["gpus"]) == {"a/0", "a/1"}
    assert all(v == [] for v in (await holders(store)).values())
    await clean(store)


async def a_lost_member_re_queues_the_gang_and_holds_its_other_parts(store: Any) -> None:
    await setup(store)
    await reserve(store)
    await started(store)
    res = await store.node_lost("b", NOW + 10, "node b missed heartbeats")
    assert res["requeued"] == ["g"]
    assert [list(s) for s in res["stops"]] == [["g", "a/0", "a/0:gpu@0:g", "a"]]
    job = await store.job("g")
    assert job.state == "pending" and job.slots == ()
    assert (await holders(store))["a/0"] == [("g", "retiring")]
    await clean(store)
    await store.node_stopped("a", "g", NOW + 11)
    assert all(v == [] for k, v in (await holders(store)).items())
    await clean(store)


async def a_failed_placement_holds_the_members_that_started_and_frees_the_rest(store: Any) -> None:
    await setup(store)
    await reserve(store)
    assert await store.mark_running("g", "", NOW + 1, "place:g:0/0", 0, "a") == "ok"
    res = await store.fail_placement("g", "no GPU 0 on b", NOW + 2, 3, "place:g:0/1", 0)
    assert res[:2] == ("ok", "pending") and res.stops == (("a", "a/0", "a/0:gpu@0:g"),)
    h = await holders(store)
    assert h["b/0"] == [] and h["a/0"] == [("g", "retiring")]
    await clean(store)
    # the failed attempt's late start report from a is a run nobody expects: it is stopped
    assert await store.mark_running("g", "", NOW + 3, "place:g:0/0", 0, "a") == "stop"


async def a_member_that_completes_before_another_starts_leaves_the_gang_placing(store: Any) -> None:
    await setup(store)
    await reserve(store)
    assert await store.mark_running("g", "", NOW + 1, "place:g:0/1", 0, "b") == "ok"
    assert (await store.release("g", "completed", "done", NOW + 2, "b/0:gpu@0:g")).status == "member"
    assert await store.mark_running("g", "", NOW + 3, "place:g:0/0", 0, "a") == "ok"
    assert (await store.job("g")).state == "running"
    assert (await store.release("g", "completed", "done", NOW + 4, "a/1:gpu@0:g")).state == "finished"
    await clean(store)


async def a_member_that_re_registers_without_its_part_re_queues_the_gang_and_stops_the_others(store: Any) -> None:
    await setup(store)
    await reserve(store)
    await started(store)
    res = await store.register_node("b", node_gpus("b"), NOW + 10, "reg-b-2", "b.example")  # b lost the run
    assert res["requeued"] == ["g"]
    assert [list(x) for x in res["stops"]] == [["g", "a/0", "a/0:gpu@0:g", "a"]]  # a's part, named with its node
    assert (await store.job("g")).state == "pending"
    h = await holders(store)
    assert h["a/0"] == [("g", "retiring")] and h["b/0"] == []
    await clean(store)


CASES = [
    a_gang_across_nodes_reserves_every_gpu_in_one_step_and_tracks_a_command_per_node,
    without_span_a_reservation_across_nodes_is_refused_and_nothing_is_held,
    a_stale_version_on_any_node_aborts_the_whole_gang,
    the_gang_runs_only_once_every_member_node_started,
    a_member_that_completes_frees_its_gpus_and_the_last_one_finishes_the_job,
    the_first_failed_member_ends_the_job_and_holds_the_others_until_they_stop,
    a_lost_member_re_queues_the_gang_and_holds_its_other_parts,
    a_failed_placement_holds_the_members_that_started_and_frees_the_rest,
    a_member_that_completes_before_another_starts_leaves_the_gang_placing,
    a_member_that_re_registers_without_its_part_re_queues_the_gang_and_stops_the_others,
]
