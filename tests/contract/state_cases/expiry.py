"""Ended jobs forgotten after their retention (``lua/expire.lua``), written once against the store interface:
``tests/contract/test_state_store.py`` runs the scenarios on ``MemoryState`` and on ``RedisState``.

A job that reaches a terminal state (finished, failed, cancelled, rejected; a cancel tombstone too) is listed
with the time it ended; ``expire(shard, before, limit, cap, settled)`` deletes at most ``limit`` of those that
ended strictly before ``before`` and, while more than ``cap`` (> 0) are listed, the oldest beyond the cap that
ended strictly before ``settled``, the oldest first: the job's record, its history and its id in the shard's
job set. A job that is not terminal is never deleted. Times are explicit (``NOW`` + offsets), never the wall clock."""

from __future__ import annotations

from typing import Any

from shared.mig.geometry import default_geometry
from shared.state import Reservation, StoredInstance, audit

GEO = default_geometry()
A100 = GEO.model("A100-40GB")
NOW = 1000.0
P1 = A100.profile("1g.5gb")
LATER = 10.0**12  # after every end time of these scenarios


def gpu(index: int) -> dict[str, Any]:
    return {"id": f"n1/{index}", "index": index, "model": "A100-40GB", "mig": True, "healthy": True,
            "uuid": f"GPU-{index}", "instances": [], "replicas": 0, "jobs": []}


def new(job: str, index: int, start: int = 0) -> StoredInstance:
    return StoredInstance(id=f"n1/{index}:1g.5gb@{start}:{job}", profile="1g.5gb", start=start,
                          size=P1.memory_slices, compute=P1.compute_slices)


async def place(store: Any, job: str, inst: StoredInstance, now: float = NOW) -> int:
    """Reserve ``inst`` for ``job`` (the job enters placing) -> the attempt of its place command."""
    gid = inst.id.split(":", 1)[0]
    (g,) = await store.get_gpus([gid])
    res = await store.reserve(
        Reservation(job_id=job, gpu_id=gid, expected_ver=g.ver, instance=inst, action="create",
                    max_count=P1.max_count, spec=b"{}", submitted_at=now),
        now,
    )
    assert res.ok, res
    return int(res.detail)


async def run(store: Any, job: str, inst: StoredInstance, now: float = NOW) -> None:
    attempt = await place(store, job, inst, now)
    assert await store.mark_running(job, inst.id, now, f"place:{job}:{attempt}", attempt, "n1", inst) == "ok"


async def kept(store: Any, job: str) -> bool:
    """Whether anything of ``job`` is still stored: its record, its history, its id in the shard's job set."""
    parts = (await store.job(job) is not None, bool(await store.history(job)), job in await store.all_job_ids(0))
    assert len(set(parts)) == 1, f"{job} half deleted: record, history, set = {parts}"
    return parts[0]


async def clean(store: Any) -> None:
    assert await audit(store, GEO) == []


async def a_finished_job_is_kept_until_its_retention_and_then_forgotten(store: Any) -> None:
    await store.register_node("n1", [gpu(0)], NOW, "reg-1")
    inst = new("j1", 0)
    await run(store, "j1", inst)
    assert (await store.release("j1", "completed", "exit 0", NOW + 10, inst.id)).status == "ok"
    assert await store.ended_before(0, LATER) == ["j1"]
    # ended at NOW + 10: not before NOW + 10
    assert await store.expire(0, NOW + 10, 1000) == 0
    assert await kept(store, "j1")
    assert (await store.job("j1")).state == "finished"
    await clean(store)
    assert await store.expire(0, NOW + 10.5, 1000) == 1
    assert not await kept(store, "j1")
    assert await store.ended_before(0, LATER) == []
    await clean(store)  # an expired job leaves nothing the audit would miss


async def every_terminal_state_expires(store: Any) -> None:
    await store.register_node("n1", [gpu(0), gpu(1)], NOW, "reg-1")
    await run(store, "done", new("done", 0))
    await store.release("done", "completed", "exit 0", NOW)
    await run(store, "crashed", new("crashed", 1))
    await store.release("crashed", "failed", "exit 1", NOW)
    a = await place(store, "unplaceable", new("unplaceable", 0, 1))
    assert (await store.fail_placement("unplaceable", "no such profile", NOW, 1, "", a))[:2] == ("ok", "failed")
    await store.enqueue("withdrawn", b"{}", 0, NOW, "no room", NOW)
    assert (await store.cancel("withdrawn", "by request", NOW)).status == "cancelled"
    await store.enqueue("impatient", b"{}", 0, NOW, "no room", NOW)
    assert await store.settle("impatient", "rejected", "waited too long", NOW, ("pending",)) == "ok"
    jobs = ["crashed", "done", "impatient", "unplaceable", "withdrawn"]
    states = sorted((j.job_id, j.state) for j in await store.jobs(jobs))
    assert [s for _, s in states] == ["failed", "finished", "rejected", "failed", "cancelled"]
    await clean(store)
    assert sorted(await store.ended_before(0, LATER)) == jobs
    assert await store.expire(0, NOW + 1, 1000) == 5
    assert [await kept(store, j) for j in jobs] == [False] * 5
    await clean(store)


async def an_active_job_is_never_removed(store: Any) -> None:
    await store.register_node("n1", [gpu(0), gpu(1)], NOW, "reg-1")
    await store.enqueue("waiting", b"{}", 0, NOW, "no room", NOW)
    await place(store, "placing", new("placing", 0))
    await run(store, "running", new("running", 1))
    # a running job with a cancel request is still active
    assert (await store.cancel("running", "by request", NOW)).status == "stop"
    assert await store.ended_before(0, LATER) == []
    assert await store.expire(0, LATER, 1000) == 0
    for job, state in (("waiting", "pending"), ("placing", "placing"), ("running", "running")):
        assert await kept(store, job)
        assert (await store.job(job)).state == state
    assert await store.pending_ids(0) == ["waiting"]
    await clean(store)


async def a_job_that_leaves_a_terminal_state_is_no_longer_listed_as_ended(store: Any) -> None:
    # no service does this today, but settle takes any from-state: such a job must not be deleted later
    await store.enqueue("j1", b"{}", 0, NOW, "no room", NOW)
    await store.settle("j1", "rejected", "waited too long", NOW, ("pending",))
    assert await store.settle("j1", "running", "revived", NOW + 1, ("rejected",)) == "ok"
    assert await store.ended_before(0, LATER) == []
    assert await store.expire(0, LATER, 1000) == 0
    assert await kept(store, "j1")
    assert (await store.job("j1")).state == "running"


async def a_cancel_tombstone_expires_too(store: Any) -> None:
    # a cancel for a job never submitted leaves a tombstone, so that its late submit is a no-op ...
    assert (await store.cancel("ghost", "by request", NOW)).status == "cancelled"
    assert await store.enqueue("ghost", b"{}", 0, NOW, "late submit", NOW + 1) == "cancelled"
    assert await kept(store, "ghost")
    await clean(store)
    # ... for the retention only
    assert await store.expire(0, NOW + 1, 1000) == 1
    assert not await kept(store, "ghost")
    await clean(store)


async def the_sweep_removes_at_most_limit_jobs_per_call_the_oldest_first(store: Any) -> None:
    # ids in another order than their end times: the order is by when they ended
    ends = {"e": NOW + 1, "a": NOW + 2, "d": NOW + 3, "b": NOW + 4, "c": NOW + 5}
    for job, at in ends.items():
        await store.enqueue(job, b"{}", 0, NOW, "no room", NOW)
        await store.settle(job, "rejected", "waited too long", at, ("pending",))
    assert await store.ended_before(0, LATER) == ["e", "a", "d", "b", "c"]
    assert await store.expire(0, LATER, 2) == 2
    assert [await kept(store, j) for j in "eadbc"] == [False, False, True, True, True]
    assert await store.ended_before(0, LATER) == ["d", "b", "c"]
    # only those ended before 'before' count, however many the limit allows
    assert await store.expire(0, NOW + 4, 1000) == 1
    assert await store.ended_before(0, LATER) == ["b", "c"]
    assert await store.expire(0, LATER, 2) == 2
    assert await store.expire(0, LATER, 2) == 0
    assert await store.all_job_ids(0) == []
    await clean(store)


async def running_the_sweep_again_changes_nothing(store: Any) -> None:
    await store.enqueue("old", b"{}", 0, NOW, "no room", NOW)
    await store.cancel("old", "by request", NOW)
    await store.enqueue("recent", b"{}", 0, NOW, "no room", NOW)
    await store.cancel("recent", "by request", NOW + 100)
    await store.enqueue("waiting", b"{}", 0, NOW, "no room", NOW)
    assert await store.expire(0, NOW + 50, 1000) == 1
    before = (await store.all_job_ids(0), await store.ended_before(0, LATER), await store.history("recent"))
    for _ in range(3):
        assert await store.expire(0, NOW + 50, 1000) == 0
    assert (await store.all_job_ids(0), await store.ended_before(0, LATER), await store.history("recent")) == before
    assert before[0] == ["recent", "waiting"]
    await clean(store)


async def _ended(store: Any, ends: dict[str, float]) -> None:
    for job, at in ends.items():
        await store.enqueue(job, b"{}", 0, NOW, "no room", NOW)
        await store.settle(job, "rejected", "waited too long", at, ("pending",))


async def beyond_the_cap_the_oldest_go_first_whatever_their_retention(store: Any) -> None:
    await _ended(store, {"e": NOW + 1, "a": NOW + 2, "d": NOW + 3, "b": NOW + 4, "c": NOW + 5})
    # retention not due for any (before = NOW), cap 3, all settled: the two oldest go
    assert await store.expire(0, NOW, 1000, 3, LATER) == 2
    assert await store.ended_before(0, LATER) == ["d", "b", "c"]
    assert [await kept(store, j) for j in "eadbc"] == [False, False, True, True, True]
    # at the cap: nothing more, however often it runs
    assert await store.expire(0, NOW, 1000, 3, LATER) == 0
    await clean(store)


async def the_cap_never_forgets_a_job_that_ended_inside_the_redelivery_horizon(store: Any) -> None:
    await _ended(store, {"e": NOW + 1, "a": NOW + 2, "d": NOW + 3, "b": NOW + 4, "c": NOW + 5})
    # cap 1 wants four gone, but only those that ended before NOW + 3 (strictly) are settled
    assert await store.expire(0, NOW, 1000, 1, NOW + 3) == 2
    assert await store.ended_before(0, LATER) == ["d", "b", "c"]
    # later the horizon has moved on: the rest beyond the cap go
    assert await store.expire(0, NOW, 1000, 1, LATER) == 2
    assert await store.ended_before(0, LATER) == ["c"]
    await clean(store)


async def retention_and_cap_together_forget_the_longer_prefix_within_the_limit(store: Any) -> None:
    await _ended(store, {"e": NOW + 1, "a": NOW + 2, "d": NOW + 3, "b": NOW + 4, "c": NOW + 5})
    # the retention alone would take e, a, d; the cap (4) only e: the retention wins
    assert await store.expire(0, NOW + 3.5, 1000, 4, LATER) == 3
    assert await store.ended_before(0, LATER) == ["b", "c"]
    await _ended(store, {"f": NOW + 6, "g": NOW + 7, "h": NOW + 8})
    # the retention takes none of b c f g h, the cap (1) four, the limit two per call
    assert await store.expire(0, NOW, 2, 1, LATER) == 2
    assert await store.ended_before(0, LATER) == ["f", "g", "h"]
    assert await store.expire(0, NOW, 2, 1, LATER) == 2
    assert await store.expire(0, NOW, 2, 1, LATER) == 0
    assert await store.ended_before(0, LATER) == ["h"]
    # no cap (0): only the retention counts
    assert await store.expire(0, NOW, 1000, 0, LATER) == 0
    assert await kept(store, "h")
    await clean(store)


async def the_cap_never_removes_an_active_job(store: Any) -> None:
    await _ended(store, {"old": NOW + 1})
    await store.enqueue("waiting", b"{}", 0, NOW, "no room", NOW)
    # only ended jobs count against the cap: one listed, a cap of one, nothing goes
    assert await store.expire(0, NOW, 1000, 1, LATER) == 0
    assert await kept(store, "old") and (await store.job("waiting")).state == "pending"
    await store.settle("waiting", "rejected", "waited too long", NOW + 2, ("pending",))
    assert await store.expire(0, NOW, 1000, 1, LATER) == 1
    assert not await kept(store, "old")
    assert (await store.job("waiting")).state == "rejected"
    await clean(store)


CASES = [
    beyond_the_cap_the_oldest_go_first_whatever_their_retention,
    the_cap_never_forgets_a_job_that_ended_inside_the_redelivery_horizon,
    retention_and_cap_together_forget_the_longer_prefix_within_the_limit,
    the_cap_never_removes_an_active_job,
    a_finished_job_is_kept_until_its_retention_and_then_forgotten,
    every_terminal_state_expires,
    an_active_job_is_never_removed,
    a_job_that_leaves_a_terminal_state_is_no_longer_listed_as_ended,
    a_cancel_tombstone_expires_too,
    the_sweep_removes_at_most_limit_jobs_per_call_the_oldest_first,
    running_the_sweep_again_changes_nothing,
]
