"""A job that ends while it is being moved, written once against the store interface:
``tests/contract/test_state_store.py`` runs the cases on ``MemoryState`` and on ``RedisState`` (``lua/release.lua``,
``lua/migrate.lua``).

The executor keeps a move's target only when the move took: a move that fails after creating the target
destroys it again, and a move of a job that already ended creates none. So the state drops a target created for
the move when the job's exit comes from the source copy (whether the abort comes before or after it), and
idles it when the exit comes from the target copy. Idling it in the first case left an instance the GPU did not
have: placements reused it and failed until jobs ran out of attempts (the 10-minute soak lost 24 of 600,000).

That holds on the source's node only (docs/architecture.md, data flow step 9): a target on another node was
created by that node, which may run the job's copy there. The state keeps such a target ``retiring`` with the job
(its slices taken) and the release names it in ``stop`` (the registry sends that node a ``stop`` of that run
only); the node's confirmation (``node_stopped``) idles it, a failed ``migrate_start`` (the node undid it) drops it.

A move that ends without taking gives back the idle instances its reservation removed from the target's way
(item 13): an abort before its command went out restores them idle (they were never touched); an abort after
the node failed the move keeps them ``retiring`` (destroyed or not, nobody knows) and names them, so the
registry sends a ``destroy_idle`` for each: the node's answer drops them or idles them again. So does a
release from the source copy during the move (``given_back``): the move's ops may not have run, and dropping
them showed slices free that the node still held (placements there failed for overlap)."""

from __future__ import annotations

from typing import Any

from shared.state import Reservation, StoredInstance
from tests.contract.state_cases.late_run import NOW, clean, gpu, held, new, place, start

P7 = "7g.40gb"


def target(job: str) -> StoredInstance:
    """The node registry's move target on n1/1 (``<gpu>:<profile>@<start>:<job>.m<stamp>``)."""
    return StoredInstance(id=f"n1/1:1g.5gb@6:{job}.m1", profile="1g.5gb", start=6, size=1, compute=1)


async def moving(store: Any, job: str) -> tuple[StoredInstance, StoredInstance]:
    """``job`` running on n1/0 and being moved to n1/1."""
    await store.register_node("n1", [gpu(0), gpu(1)], NOW, "reg-1")
    src = new(job, 0)
    attempt = await place(store, job, src)
    assert await start(store, job, src, attempt) == "ok"
    (g1,) = await store.get_gpus(["n1/1"])
    b = store.batch()
    b.migrate_reserve(job, src.id, "n1/1", g1.ver, target(job), (), 7, 120.0, "defrag", NOW)
    assert (await b.run())[0][0] == "ok"
    return src, target(job)


async def an_exit_from_the_source_during_a_move_drops_the_created_target(store: Any) -> None:
    src, _dst = await moving(store, "j1")
    assert (await store.release("j1", "completed", "exit 0", NOW + 1, src.id)).status == "ok"
    assert await held(store, "n1/1") == []  # the executor destroyed it (or never made it)
    assert await held(store, "n1/0") == [(src.id, "idle", None)]
    b = store.batch()
    b.migrate_finish("abort", "j1", "target exited", NOW + 2)  # the move's failure, after the exit
    assert (await b.run())[0][0] == "noop"
    assert await held(store, "n1/1") == []
    await clean(store)


async def an_abort_before_the_exit_drops_the_target_and_the_exit_then_frees_the_source(store: Any) -> None:
    src, _dst = await moving(store, "j2")
    b = store.batch()
    b.migrate_finish("abort", "j2", "source ended during the move", NOW + 1)
    assert (await b.run())[0][0] == "ok"
    assert (await store.release("j2", "completed", "exit 0", NOW + 2, src.id)).status == "ok"
    assert await held(store, "n1/1") == []
    assert await held(store, "n1/0") == [(src.id, "idle", None)]
    await clean(store)


async def an_exit_from_the_target_before_the_commit_leaves_the_target_idle(store: Any) -> None:
    src, dst = await moving(store, "j3")
    assert (await store.release("j3", "completed", "exit 0", NOW + 1, dst.id)).status == "ok"
    assert await held(store, "n1/1") == [(dst.id, "idle", None)]  # the move took: the instance exists
    assert await held(store, "n1/0") == [(src.id, "idle", None)]
    await clean(store)


def far_target(job: str) -> StoredInstance:
    """A move target on another node (n2/0)."""
    return StoredInstance(id=f"n2/0:1g.5gb@6:{job}.m1", profile="1g.5gb", start=6, size=1, compute=1)


async def moving_away(store: Any, job: str) -> tuple[StoredInstance, StoredInstance]:
    """``job`` running on n1/0 and being moved to n2/0 (another node)."""
    await store.register_node("n1", [gpu(0)], NOW, "reg-1")
    await store.register_node("n2", [gpu(0) | {"id": "n2/0", "uuid": "GPU-n2-0"}], NOW, "reg-1")
    src = new(job, 0)
    attempt = await place(store, job, src)
    assert await start(store, job, src, attempt) == "ok"
    (g,) = await store.get_gpus(["n2/0"])
    b = store.batch()
    b.migrate_reserve(job, src.id, "n2/0", g.ver, far_target(job), (), 7, 120.0, "defrag", NOW)
    assert (await b.run())[0][0] == "ok"
    return src, far_target(job)


async def an_exit_from_the_source_during_a_move_to_another_node_holds_the_target_until_that_node_stops_it(
    store: Any,
) -> None:
    src, dst = await moving_away(store, "j4")
    res = await store.release("j4", "completed", "exit 0", NOW + 1, src.id)
    assert (res.status, res.state) == ("ok", "finished")
    assert res.stop == ("n2", "n2/0", dst.id)  # the registry stops the copy that node may run there
    assert await held(store, "n1/0") == [(src.id, "idle", None)]
    assert await held(store, "n2/0") == [(dst.id, "retiring", "j4")]  # its slices stay taken
    (g,) = await store.get_gpus(["n2/0"])
    other = await store.reserve(
        Reservation(job_id="j5", gpu_id="n2/0", expected_ver=g.ver, instance=StoredInstance(
            id="n2/0:7g.40gb@0:j5", profile=P7, start=0, size=8, compute=7), action="create", max_count=1,
            spec=b"{}", submitted_at=NOW),
        NOW,
    )
    assert not other.ok  # no placement on slices the node may still use
    await clean(store)
    # the move's failure or its confirmation after the exit changes nothing
    b = store.batch()
    b.migrate_finish("commit", "j4", "moved", NOW + 2)
    assert (await b.run())[0][0] == "noop"
    assert await held(store, "n2/0") == [(dst.id, "retiring", "j4")]
    # the stopped copy's exit is not the job's; the node's confirmation idles the instance: it exists there
    assert (await store.release("j4", "cancelled", "stopped", NOW + 3, dst.id)).status == "noop"
    assert (await store.node_stopped("n2", "j4", NOW + 3))["gpus"] == ["n2/0"]
    assert await held(store, "n2/0") == [(dst.id, "idle", None)]
    assert (await store.job("j4")).state == "finished"
    await clean(store)


async def a_move_start_the_other_node_failed_after_the_source_exit_drops_the_held_target(store: Any) -> None:
    src, dst = await moving_away(store, "j6")
    assert (await store.release("j6", "completed", "exit 0", NOW + 1, src.id)).stop == ("n2", "n2/0", dst.id)
    b = store.batch()
    # the node failed the move (it undid the target); its cmd_failed comes before the stop's cmd_done
    b.migrate_finish("abort", "j6", "failed", NOW + 2, node="n2", target=":j6.m1")
    assert (await b.run())[0][0] == "noop"
    assert await held(store, "n2/0") == []
    assert (await store.node_stopped("n2", "j6", NOW + 3))["gpus"] == []
    assert await held(store, "n2/0") == []
    await clean(store)


async def an_exit_from_the_source_during_a_move_on_the_same_node_drops_the_target_and_asks_no_stop(
    store: Any,
) -> None:
    src, _dst = await moving(store, "j7")
    res = await store.release("j7", "completed", "exit 0", NOW + 1, src.id)
    assert (res.status, res.stop) == ("ok", None)  # that executor undid it: no copy runs there
    assert await held(store, "n1/1") == []
    await clean(store)


def in_the_way(index: int = 1) -> dict[str, Any]:
    """An idle 7g.40gb registered on n1/<index>: every move target there must destroy it."""
    return gpu(index) | {"instances": [{"id": f"n1/{index}:7g.40gb@0", "profile": P7, "start": 0, "size": 8,
                                        "compute": 7}]}


async def moving_over_an_idle(store: Any, job: str) -> tuple[StoredInstance, str]:
    """``job`` running on n1/0 and being moved to n1/1, whose idle 7g.40gb the move destroys."""
    await store.register_node("n1", [gpu(0), in_the_way(1)], NOW, "reg-1")
    src = new(job, 0)
    attempt = await place(store, job, src)
    assert await start(store, job, src, attempt) == "ok"
    (g1,) = await store.get_gpus(["n1/1"])
    b = store.batch()
    b.migrate_reserve(job, src.id, "n1/1", g1.ver, target(job), ("n1/1:7g.40gb@0",), 7, 120.0, "defrag", NOW)
    assert (await b.run())[0][0] == "ok"
    assert await held(store, "n1/1") == [(target(job).id, "target", job)]
    return src, "n1/1:7g.40gb@0"


async def a_move_aborted_before_its_command_went_out_gives_back_the_idle_instance_in_its_way(store: Any) -> None:
    _src, idle = await moving_over_an_idle(store, "j8")
    (g0,) = await store.get_gpus(["n1/1"])
    b = store.batch()
    b.migrate_finish("abort", "j8", "migration plan conflict", NOW + 1, gone="idle")
    assert (await b.run())[0] == ("ok", "")
    assert await held(store, "n1/1") == [(idle, "idle", None)]  # the node never destroyed it
    (g,) = await store.get_gpus(["n1/1"])
    assert g.ver > g0.ver and g.busy_mask == 0  # claimed again: a decision made without it cannot commit
    assert (await store.job("j8")).state == "running"
    await clean(store)


async def a_failed_move_start_holds_the_idle_instance_in_its_way_until_a_destroy_confirms(store: Any) -> None:
    _src, idle = await moving_over_an_idle(store, "j9")
    b = store.batch()
    b.migrate_finish("abort", "j9", "executor failed migrate_start", NOW + 1)
    assert (await b.run())[0] == ("ok", f"n1/1|{idle}")  # destroyed or not: a destroy_idle settles it
    assert await held(store, "n1/1") == [(idle, "retiring", None)]
    await clean(store)
    assert await store.instance("drop", "n1", "n1/1", idle, NOW + 2) == "ok"
    assert await held(store, "n1/1") == []
    await clean(store)


async def a_committed_move_leaves_the_idle_instance_in_its_way_destroyed(store: Any) -> None:
    await moving_over_an_idle(store, "j10")
    b = store.batch()
    b.migrate_finish("commit", "j10", "moved", NOW + 1)
    assert (await b.run())[0][0] == "ok"
    assert await held(store, "n1/1") == [(target("j10").id, "busy", "j10")]
    await clean(store)


async def an_exit_before_the_move_started_holds_the_idle_instance_in_its_way_until_a_destroy_confirms(
    store: Any,
) -> None:
    src, idle = await moving_over_an_idle(store, "j11")
    (g0,) = await store.get_gpus(["n1/1"])
    res = await store.release("j11", "completed", "exit 0", NOW + 1, src.id)
    # the move's ops (which destroy it) may not have run: its slices stay taken until the node confirms
    assert (res.status, res.given_back) == ("ok", f"n1/1|{idle}")
    assert await held(store, "n1/1") == [(idle, "retiring", None)]
    (g,) = await store.get_gpus(["n1/1"])
    assert g.ver > g0.ver and g.busy_mask != 0  # a decision that saw the slices free cannot commit
    other = new("j12", 1, 6)
    refused = await store.reserve(
        Reservation(job_id="j12", gpu_id="n1/1", expected_ver=g.ver, instance=other, action="create",
                    max_count=7, spec=b"{}", submitted_at=NOW),
        NOW + 1,
    )
    assert (refused.status, refused.detail) == ("overlap", idle)
    b = store.batch()
    b.migrate_finish("abort", "j11", "failed", NOW + 2)  # the move's failure after the exit changes nothing
    assert (await b.run())[0][0] == "noop"
    assert await held(store, "n1/1") == [(idle, "retiring", None)]
    await clean(store)
    assert await store.instance("drop", "n1", "n1/1", idle, NOW + 3) == "ok"  # the destroy_idle confirmed
    assert await held(store, "n1/1") == []
    await clean(store)


async def an_exit_from_the_target_of_a_move_over_an_idle_gives_back_nothing(store: Any) -> None:
    _src, _idle = await moving_over_an_idle(store, "j13")
    res = await store.release("j13", "completed", "exit 0", NOW + 1, target("j13").id)
    assert (res.status, res.given_back) == ("ok", "")  # the node made the target: the move's ops ran
    assert await held(store, "n1/1") == [(target("j13").id, "idle", None)]
    await clean(store)


CASES = [
    an_exit_from_the_source_during_a_move_drops_the_created_target,
    an_abort_before_the_exit_drops_the_target_and_the_exit_then_frees_the_source,
    an_exit_from_the_target_before_the_commit_leaves_the_target_idle,
    an_exit_from_the_source_during_a_move_to_another_node_holds_the_target_until_that_node_stops_it,
    a_move_start_the_other_node_failed_after_the_source_exit_drops_the_held_target,
    an_exit_from_the_source_during_a_move_on_the_same_node_drops_the_target_and_asks_no_stop,
    a_move_aborted_before_its_command_went_out_gives_back_the_idle_instance_in_its_way,
    a_failed_move_start_holds_the_idle_instance_in_its_way_until_a_destroy_confirms,
    a_committed_move_leaves_the_idle_instance_in_its_way_destroyed,
    an_exit_before_the_move_started_holds_the_idle_instance_in_its_way_until_a_destroy_confirms,
    an_exit_from_the_target_of_a_move_over_an_idle_gives_back_nothing,
]
