"""The in-memory state store: the transitions' semantics without a server, and the invariants under random
sequences of transitions (the Redis store runs the same scenarios in tests/integration/test_state_*)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.mig.geometry import default_geometry
from shared.mig.occupancy import free_starts
from shared.state import Reservation, StoredInstance, audit
from shared.state.memory_store import MemoryState

pytestmark = pytest.mark.unit
GEO = default_geometry()
A100 = GEO.model("A100-40GB")


def gpu(index: int, instances: list[dict] | None = None) -> dict:  # type: ignore[type-arg]
    return {
        "id": f"n1/{index}",
        "index": index,
        "model": "A100-40GB",
        "mig": True,
        "healthy": True,
        "uuid": "",
        "instances": instances or [],
    }


def res(
    job: str, profile: str, start: int, ver: int, gpu_id: str = "n1/0", destroy: tuple[str, ...] = ()
) -> Reservation:
    p = A100.profile(profile)
    inst = StoredInstance(
        id=f"{gpu_id}:{profile}@{start}:{job}",
        profile=profile,
        start=start,
        size=p.memory_slices,
        compute=p.compute_slices,
    )
    return Reservation(
        job_id=job,
        gpu_id=gpu_id,
        expected_ver=ver,
        instance=inst,
        action="create",
        destroy=destroy,
        max_count=p.max_count,
        spec=b"{}",
        submitted_at=1.0,
    )


async def fresh() -> MemoryState:
    s = MemoryState()
    await s.register_node("n1", [gpu(0), gpu(1)], 1.0)
    return s


async def test_a_reservation_wins_once_and_a_stale_one_loses() -> None:
    s = await fresh()
    assert (await s.reserve(res("a", "3g.20gb", 4, 1), 2.0)).ver == 2
    assert (await s.reserve(res("b", "1g.5gb", 0, 1), 2.0)).status == "conflict"
    assert (await s.reserve(res("b", "1g.5gb", 6, 2), 2.0)).status == "overlap"
    assert (await s.occupancy(0))[0] == 0b11110000
    assert await audit(s, GEO) == []


async def test_the_lifecycle_is_recorded_and_release_is_idempotent() -> None:
    s = await fresh()
    await s.reserve(res("a", "2g.10gb", 4, 1), 2.0)
    assert await s.mark_running("a", "", 3.0) == "ok"
    assert (await s.release("a", "completed", "exit 0", 4.0)).status == "ok"
    assert (await s.release("a", "completed", "exit 0", 4.0)).status == "noop"
    assert [(h.prev, h.to) for h in await s.history("a")] == [
        ("", "placing"),
        ("placing", "running"),
        ("running", "finished"),
    ]


async def test_lost_and_failed_jobs_go_back_to_the_queue_in_priority_order() -> None:
    s = await fresh()
    await s.enqueue("low", b"{}", 0, 1.0, "no room", 1.0)
    await s.enqueue("high", b"{}", 10, 2.0, "no room", 1.0)
    await s.reserve(res("a", "1g.5gb", 6, 1), 2.0)
    assert (await s.release("a", "lost", "node died", 3.0)).state == "pending"
    assert [j.job_id for j in await s.pending()] == ["high", "a", "low"]
    assert (await s.reserve(res("low", "1g.5gb", 5, 2), 4.0)).ok  # the release freed: no claim, same version
    assert (await s.fail_placement("low", "NVML", 5.0, max_attempts=1))[:3] == ("ok", "failed", "n1/0")
    assert await audit(s, GEO) == []


async def test_a_migration_moves_the_job_make_before_break() -> None:
    s = await fresh()
    await s.reserve(res("a", "1g.5gb", 0, 1), 2.0)
    await s.mark_running("a", "", 2.0)
    tgt = StoredInstance(id="n1/1:1g.5gb@6:a.m", profile="1g.5gb", start=6, size=1, compute=1)
    b = s.batch()
    b.migrate_reserve("a", "n1/0:1g.5gb@0:a", "n1/1", 1, tgt, (), 7, 120.0, "defrag", 3.0)
    b.migrate_finish("commit", "a", "moved", 4.0)
    assert [r[0] for r in await b.run()] == ["ok", "ok"]
    j = await s.job("a")
    assert j is not None and (j.state, j.gpu, j.inst) == ("running", "n1/1", tgt.id)
    assert await audit(s, GEO) == []


async def test_a_lost_node_requeues_its_jobs() -> None:
    s = await fresh()
    await s.reserve(res("a", "1g.5gb", 6, 1), 2.0)
    assert (await s.node_lost("n1", 3.0, "silent"))["requeued"] == ["a"]
    assert (await s.job("a")).state == "pending"  # type: ignore[union-attr]
    await s.register_node("n1", [gpu(0), gpu(1)], 4.0)
    assert (await s.get_gpus(["n1/0"]))[0].healthy  # type: ignore[union-attr]
    assert await audit(s, GEO) == []


PROFILES = ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "1g.10gb"]
step = st.tuples(
    st.sampled_from(["reserve", "stale", "run", "exit", "lost", "fail", "retire", "drop", "cancel"]),
    st.integers(0, 1),
    st.sampled_from(PROFILES),
    st.integers(0, 7),
    st.integers(0, 30),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(step, min_size=1, max_size=40))
def test_random_transition_sequences_keep_every_invariant(steps: list) -> None:  # type: ignore[type-arg]
    asyncio.run(_replay(steps))


async def _replay(steps: list) -> None:  # type: ignore[type-arg]
    s = await fresh()
    t = 10.0
    for n, (op, gi, prof, pick, jn) in enumerate(steps):
        t += 1
        gid = f"n1/{gi}"
        (g,) = await s.get_gpus([gid])
        assert g is not None
        job = f"j{jn}"
        if op in ("reserve", "stale"):
            p = A100.profile(prof)
            starts = free_starts(p, g.busy_mask)
            if not starts:
                continue
            start = starts[pick % len(starts)]
            pm = ((1 << p.memory_slices) - 1) << start
            destroy = tuple(i.id for i in g.instances if i.state == "idle" and i.mask & pm)
            r = res(f"{job}-{n}", prof, start, g.ver - (op == "stale"), gid, destroy)
            out = await s.reserve(r, t)
            assert out.status in (("ok", "count") if op == "reserve" else ("conflict",))
        elif op == "run":
            busy = [i for i in g.instances if i.state == "reserved"]
            if busy:
                assert await s.mark_running(busy[pick % len(busy)].job or "", "", t) == "ok"
        elif op == "exit":
            busy = [i for i in g.instances if i.job and i.state in ("busy", "reserved")]
            if busy:
                assert (await s.release(busy[pick % len(busy)].job or "", "completed", "", t)).status == "ok"
        elif op == "fail":
            busy = [i for i in g.instances if i.state == "reserved"]
            if busy:
                await s.fail_placement(busy[pick % len(busy)].job or "", "x", t, max_attempts=2)
        elif op == "lost":
            await s.node_lost("n1", t, "silent")
            await s.register_node("n1", [gpu(0), gpu(1)], t)
        elif op in ("retire", "drop"):
            idle = [i for i in g.instances if i.state in ("idle", "retiring")]
            if idle:
                await s.instance(op, "n1", gid, idle[pick % len(idle)].id, t)
        elif op == "cancel":
            await s.cancel(job, "user", t)
        assert await audit(s, GEO) == [], (n, op)


async def test_a_redelivered_registration_changes_nothing_but_a_new_one_is_applied() -> None:
    s = MemoryState()
    await s.register_node("n1", [gpu(0)], 1.0, "reg-1")
    assert (await s.reserve(res("a", "3g.20gb", 0, 1), 2.0)).ok
    await s.mark_running("a", "n1/0:3g.20gb@0:a", 3.0)
    await s.release("a", "completed", "done", 4.0)
    again = await s.register_node("n1", [gpu(0)], 5.0, "reg-1")
    assert again["replay"] is True and again["gpus"] == ["n1/0"]
    (g,) = await s.get_gpus(["n1/0"])
    assert g is not None and [(i.id, i.state) for i in g.instances] == [("n1/0:3g.20gb@0:a", "idle")]
    fresh_reg = await s.register_node("n1", [gpu(0)], 6.0, "reg-2")  # a new registration: unreported = gone
    assert "replay" not in fresh_reg
    (g,) = await s.get_gpus(["n1/0"])
    assert g is not None and g.instances == []
