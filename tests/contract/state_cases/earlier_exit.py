"""The exit of a run an earlier placement of the job started, written once against the store interface:
``tests/contract/test_state_store.py`` runs the cases on ``MemoryState`` and on ``RedisState``
(``lua/release.lua``, ``lua/mark_running.lua``).

An exit carries the attempt of the place command that started its run. A job re-queued and placed again on the
same instance (an idle one reused) is told apart from its earlier run only by that attempt: the earlier run's
exit, reported late, must not end the new placement. A late run the new placement took as its own
(``mark_running`` answered ``ok``) ends it with its exit, whatever attempt started it."""

from __future__ import annotations

from typing import Any

from shared.state import StoredInstance
from tests.contract.state_cases.late_run import NOW, P1, clean, gpu, held, place, start

IDLE = StoredInstance(id="n1/0:1g.5gb@0", profile="1g.5gb", start=0, size=P1.memory_slices,
                      compute=P1.compute_slices)


async def with_idle_instance(store: Any) -> None:
    """Node n1 with one GPU holding one idle 1g instance, ``IDLE``: every placement reuses it."""
    await store.register_node("n1", [gpu(0) | {"instances": [
        {"id": IDLE.id, "profile": "1g.5gb", "start": 0, "size": P1.memory_slices,
         "compute": P1.compute_slices}]}], NOW, "reg-1")


async def placed_twice(store: Any) -> tuple[int, int]:
    """j1 ran on ``IDLE``, was re-queued (its node lost touch: the run was stopped) and is placed there again."""
    await with_idle_instance(store)
    a0 = await place(store, "j1", IDLE, "reuse")
    assert await start(store, "j1", IDLE, a0) == "ok"
    assert (await store.release("j1", "lost", "node resync", NOW, "", "", None)).state == "pending"
    a1 = await place(store, "j1", IDLE, "reuse")
    assert a1 > a0
    return a0, a1


async def an_earlier_runs_exit_on_the_instance_the_job_is_placed_on_again_ends_nothing(store: Any) -> None:
    a0, a1 = await placed_twice(store)
    # the first run's exit, held back by the executor, arrives while the new placement is still starting
    res = await store.release("j1", "cancelled", "stopped", NOW, IDLE.id, "n1", a0)
    assert res.status == "stale"
    j = await store.job("j1")
    assert (j.state, j.inst) == ("placing", IDLE.id)
    assert await held(store, "n1/0") == [(IDLE.id, "reserved", "j1")]
    assert await start(store, "j1", IDLE, a1) == "ok"
    # and again once the new run has started: still the earlier run's
    assert (await store.release("j1", "cancelled", "stopped", NOW, IDLE.id, "n1", a0)).status == "stale"
    assert (await store.job("j1")).state == "running"
    assert await held(store, "n1/0") == [(IDLE.id, "busy", "j1")]
    await clean(store)
    # the new run's own exit ends the job
    res = await store.release("j1", "completed", "exit 0", NOW, IDLE.id, "n1", a1)
    assert (res.status, res.state) == ("ok", "finished")
    assert await held(store, "n1/0") == [(IDLE.id, "idle", None)]
    await clean(store)


async def an_exit_whose_attempt_is_unknown_is_the_current_runs(store: Any) -> None:
    _, a1 = await placed_twice(store)
    assert await start(store, "j1", IDLE, a1) == "ok"
    # a run adopted by a restarted executor reports no command: judged by its instance alone, as before
    res = await store.release("j1", "failed", "exit 1", NOW, IDLE.id, "n1", None)
    assert (res.status, res.state) == ("ok", "failed")
    await clean(store)


async def a_late_run_the_placement_took_as_its_own_ends_it_with_its_exit(store: Any) -> None:
    await with_idle_instance(store)
    a0 = await place(store, "j1", IDLE, "reuse")
    await store.fail_placement("j1", "no result", NOW, 3, f"place:j1:{a0}", a0)
    a1 = await place(store, "j1", IDLE, "reuse")
    # the timed-out command ran after all, on the instance the new placement names: that run is the placement's
    assert await start(store, "j1", IDLE, a0) == "ok"
    assert await start(store, "j1", IDLE, a1) == "noop"
    res = await store.release("j1", "completed", "exit 0", NOW, IDLE.id, "n1", a0)
    assert (res.status, res.state) == ("ok", "finished")
    assert await held(store, "n1/0") == [(IDLE.id, "idle", None)]
    await clean(store)


async def a_late_run_taken_by_one_placement_is_stale_for_the_next(store: Any) -> None:
    await with_idle_instance(store)
    a0 = await place(store, "j1", IDLE, "reuse")
    await store.fail_placement("j1", "no result", NOW, 3, f"place:j1:{a0}", a0)
    await place(store, "j1", IDLE, "reuse")
    assert await start(store, "j1", IDLE, a0) == "ok"
    # that run is lost with its node; the job is placed a third time, on the same instance
    assert (await store.release("j1", "lost", "node resync", NOW, "", "", None)).state == "pending"
    a2 = await place(store, "j1", IDLE, "reuse")
    assert (await store.release("j1", "cancelled", "stopped", NOW, IDLE.id, "n1", a0)).status == "stale"
    j = await store.job("j1")
    assert (j.state, j.attempts) == ("placing", a2)
    await clean(store)



async def once_released_only_the_report_that_released_the_job_gets_its_gpu_back(store: Any) -> None:
    await with_idle_instance(store)
    a0 = await place(store, "j1", IDLE, "reuse")
    assert await start(store, "j1", IDLE, a0) == "ok"
    res = await store.release("j1", "completed", "exit 0", NOW, IDLE.id, "n1", a0, "exit-1")
    assert (res.status, res.state) == ("ok", "finished")
    # the same report, redelivered (its job exit may not have gone out): the GPU, so it goes out again
    again = await store.release("j1", "completed", "exit 0", NOW, IDLE.id, "n1", a0, "exit-1")
    assert (again.status, again.gpu_id) == ("noop", "n1/0") and again.gpu is not None
    # another report naming the same instance (another copy of the job): nothing
    other = await store.release("j1", "completed", "exit 0", NOW, IDLE.id, "n1", a0, "exit-2")
    assert (other.status, other.gpu_id, other.gpu) == ("noop", "", None)
    # a report of unknown id keeps the old rule: the last instance named is enough
    assert (await store.release("j1", "completed", "exit 0", NOW, IDLE.id, "n1", a0)).gpu_id == "n1/0"

CASES = [
    an_earlier_runs_exit_on_the_instance_the_job_is_placed_on_again_ends_nothing,
    an_exit_whose_attempt_is_unknown_is_the_current_runs,
    a_late_run_the_placement_took_as_its_own_ends_it_with_its_exit,
    a_late_run_taken_by_one_placement_is_stale_for_the_next,
    once_released_only_the_report_that_released_the_job_gets_its_gpu_back,
]
