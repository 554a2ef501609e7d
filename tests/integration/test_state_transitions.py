"""Every state transition against a real Redis: one Lua script each, compare-and-set on the GPU's version."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from services.common.testing import make_settings
from shared.mig.geometry import default_geometry
from shared.state import RedisState, Reservation, StoredInstance, audit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]
GEO = default_geometry()
A100 = GEO.model("A100-40GB")


@pytest.fixture
async def state(prefix: str, redis_url: str, nats_url: str) -> AsyncIterator[RedisState]:
    st = RedisState.from_settings(make_settings(prefix, nats_url, redis_url))
    await st.register_node("n1", [gpu(0), gpu(1)], time.time())
    yield st
    await st.wipe()
    await st.close()


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
    job: str,
    profile: str,
    start: int,
    ver: int,
    gpu_id: str = "n1/0",
    action: str = "create",
    iid: str | None = None,
    destroy: tuple[str, ...] = (),
) -> Reservation:
    p = A100.profile(profile)
    inst = StoredInstance(
        id=iid or f"{gpu_id}:{profile}@{start}:{job}",
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
        action=action,  # type: ignore[arg-type]
        destroy=destroy,
        max_count=p.max_count,
        spec=b"{}",
        prio=0,
        submitted_at=1.0,
        reason="test",
    )


async def test_a_reservation_books_the_slices_and_bumps_the_version(state: RedisState) -> None:
    r = await state.reserve(res("j1", "3g.20gb", 4, ver=1), time.time())
    assert r.ok and r.ver == 2
    (g,) = await state.get_gpus(["n1/0"])
    assert g is not None and g.ver == 2 and g.busy_mask == 0b11110000
    assert (await state.occupancy(0))[g.pos] == 0b11110000
    job = await state.job("j1")
    assert job is not None and job.state == "placing" and job.gpu == "n1/0" and job.node == "n1"


async def test_a_stale_version_loses_the_compare_and_set(state: RedisState) -> None:
    assert (await state.reserve(res("j1", "1g.5gb", 6, ver=1), time.time())).ok
    lost = await state.reserve(res("j2", "1g.5gb", 5, ver=1), time.time())
    assert lost.status == "conflict"
    assert await state.job("j2") is None


async def test_an_overlap_is_refused_even_at_the_right_version(state: RedisState) -> None:
    assert (await state.reserve(res("j1", "3g.20gb", 4, ver=1), time.time())).ok
    r = await state.reserve(res("j2", "4g.20gb", 0, ver=2), time.time())
    assert r.ok  # 0..3 is free
    r = await state.reserve(res("j3", "1g.5gb", 6, ver=3), time.time())
    assert r.status == "overlap"


async def test_a_placement_may_destroy_idle_instances_in_its_way_but_never_busy_ones(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    st = RedisState.from_settings(make_settings(prefix, nats_url, redis_url))
    idle = {"id": "n1/0:1g.5gb@0:old", "profile": "1g.5gb", "start": 0, "size": 1, "compute": 1}
    await st.register_node("n1", [gpu(0, [idle])], time.time())
    try:
        r = await st.reserve(res("j1", "4g.20gb", 0, ver=1, destroy=("n1/0:1g.5gb@0:old",)), time.time())
        assert r.ok
        (g,) = await st.get_gpus(["n1/0"])
        assert g is not None and [i.id for i in g.instances] == ["n1/0:4g.20gb@0:j1"]
        r = await st.reserve(res("j2", "7g.40gb", 0, ver=2, destroy=("n1/0:4g.20gb@0:j1",)), time.time())
        assert r.status == "busy"
    finally:
        await st.wipe()
        await st.close()


async def test_reusing_an_idle_instance_keeps_its_id(prefix: str, nats_url: str, redis_url: str) -> None:
    st = RedisState.from_settings(make_settings(prefix, nats_url, redis_url))
    idle = {"id": "n1/0:1g.5gb@6:old", "profile": "1g.5gb", "start": 6, "size": 1, "compute": 1}
    await st.register_node("n1", [gpu(0, [idle])], time.time())
    try:
        r = await st.reserve(
            res("j1", "1g.5gb", 6, ver=1, action="reuse", iid="n1/0:1g.5gb@6:old"), time.time()
        )
        assert r.ok
        assert (await st.job("j1")).inst == "n1/0:1g.5gb@6:old"  # type: ignore[union-attr]
        again = await st.reserve(
            res("j2", "1g.5gb", 6, ver=2, action="reuse", iid="n1/0:1g.5gb@6:old"), time.time()
        )
        assert again.status == "busy"
    finally:
        await st.wipe()
        await st.close()


async def test_release_is_idempotent_and_the_lifecycle_is_recorded(state: RedisState) -> None:
    now = time.time()
    assert (await state.reserve(res("j1", "2g.10gb", 4, ver=1), now)).ok
    assert await state.mark_running("j1", "n1/0:2g.10gb@4:j1", now) == "ok"
    assert await state.mark_running("j1", "n1/0:2g.10gb@4:j1", now) == "noop"
    first = await state.release("j1", "completed", "exit 0", now, "n1/0:2g.10gb@4:j1")
    again = await state.release("j1", "completed", "exit 0", now, "n1/0:2g.10gb@4:j1")
    assert first.status == "ok" and first.state == "finished" and first.profile == "2g.10gb"
    assert again.status == "noop"
    (g,) = await state.get_gpus(["n1/0"])
    assert g is not None and g.busy_mask == 0 and g.instances[0].state == "idle"
    hist = await state.history("j1")
    assert [(h.prev, h.to) for h in hist] == [
        ("", "placing"),
        ("placing", "running"),
        ("running", "finished"),
    ]
    assert hist[-1].reason == "exit 0"
    assert await audit(state, GEO) == []


async def test_an_exit_from_an_older_placement_is_stale(state: RedisState) -> None:
    now = time.time()
    assert (await state.reserve(res("j1", "1g.5gb", 6, ver=1), now)).ok
    r = await state.release("j1", "completed", "late", now, "n1/1:1g.5gb@6:elsewhere")
    assert r.status == "stale"
    assert (await state.job("j1")).state == "placing"  # type: ignore[union-attr]


async def test_a_lost_job_goes_back_to_the_queue_in_priority_order(state: RedisState) -> None:
    now = time.time()
    assert await state.enqueue("low", b"{}", 0, 1.0, "no room", now) == "queued"
    assert await state.enqueue("high", b"{}", 10, 2.0, "no room", now) == "queued"
    assert await state.enqueue("high", b"{}", 10, 2.0, "still no room", now) == "pending"
    assert (await state.reserve(res("j1", "1g.5gb", 6, ver=1), now)).ok
    assert (await state.release("j1", "lost", "node died", now)).state == "pending"
    assert [j.job_id for j in await state.pending(0)] == ["high", "j1", "low"]
    job = await state.job("j1")
    assert job is not None and job.attempts == 1 and job.gpu == ""
    assert await audit(state, GEO) == []


async def test_a_failed_placement_is_requeued_then_failed_after_max_attempts(state: RedisState) -> None:
    now = time.time()
    assert (await state.reserve(res("j1", "1g.5gb", 6, ver=1), now)).ok
    assert (await state.fail_placement("j1", "NVML error", now, max_attempts=2))[:3] == ("ok", "pending", "n1/0")
    (g,) = await state.get_gpus(["n1/0"])
    assert g is not None and g.instances == [] and g.ver == 2  # the created reservation is gone; freeing
    assert (await state.reserve(res("j1", "1g.5gb", 6, ver=2), now)).ok  # claims nothing: same CAS version
    assert (await state.fail_placement("j1", "NVML error", now, max_attempts=2))[:3] == ("ok", "failed", "n1/0")
    assert (await state.fail_placement("j1", "NVML error", now, max_attempts=2))[:3] == ("noop", "failed", "")
    assert await audit(state, GEO) == []


async def test_cancel_ends_a_pending_job_and_asks_to_stop_a_running_one(state: RedisState) -> None:
    now = time.time()
    await state.enqueue("p", b"{}", 0, 1.0, "no room", now)
    assert (await state.cancel("p", "user", now)).status == "cancelled"
    assert await state.pending(0) == []
    assert (await state.reserve(res("r", "1g.5gb", 6, ver=1), now)).ok
    c = await state.cancel("r", "user", now)
    assert c.status == "stop" and c.node == "n1" and c.instance_id == "n1/0:1g.5gb@6:r"
    assert (await state.cancel("ghost", "user", now)).status == "cancelled"
    assert (await state.reserve(res("ghost", "1g.5gb", 5, ver=2), now)).status == "known"


async def test_a_retired_instance_holds_its_slices_until_dropped(state: RedisState) -> None:
    now = time.time()
    assert (await state.reserve(res("j1", "1g.5gb", 6, ver=1), now)).ok
    await state.release("j1", "completed", "", now)
    assert await state.instance("retire", "n1", "n1/0", "n1/0:1g.5gb@6:j1", now) == "ok"
    (g,) = await state.get_gpus(["n1/0"])
    assert g is not None and g.busy_mask == 0b1000000 and g.view().busy_mask == 0b1000000
    assert await state.instance("drop", "n1", "n1/0", "n1/0:1g.5gb@6:j1", now) == "ok"
    (g,) = await state.get_gpus(["n1/0"])
    assert g is not None and g.instances == []


async def test_a_migration_reserves_the_target_and_commits_make_before_break(state: RedisState) -> None:
    now = time.time()
    assert (await state.reserve(res("j1", "1g.5gb", 0, ver=1), now)).ok
    assert await state.mark_running("j1", "", now) == "ok"
    tgt = StoredInstance(id="n1/1:1g.5gb@6:j1.m1", profile="1g.5gb", start=6, size=1, compute=1)
    b = state.batch()
    b.migrate_reserve("j1", "n1/0:1g.5gb@0:j1", "n1/1", 1, tgt, (), 7, 120.0, "defrag", now)
    assert (await b.run())[0] == ("ok", "n1/1:1g.5gb@6:j1.m1")
    assert (await state.job("j1")).state == "migrating"  # type: ignore[union-attr]
    assert await audit(state, GEO) == []
    b = state.batch()
    b.migrate_finish("commit", "j1", "moved", now)
    assert (await b.run())[0][0] == "ok"
    job = await state.job("j1")
    assert job is not None and job.state == "running" and job.gpu == "n1/1" and job.inst == tgt.id
    g0, g1 = await state.get_gpus(["n1/0", "n1/1"])
    assert g0 is not None and g1 is not None and g0.busy_mask == 0 and g1.busy_mask == 0b1000000
    # the cooldown now refuses another move of the same job
    b = state.batch()
    b.migrate_reserve(
        "j1",
        tgt.id,
        "n1/0",
        g0.ver,
        StoredInstance(id="x", profile="1g.5gb", start=6, size=1, compute=1),
        (),
        7,
        120.0,
        "again",
        now + 1,
    )
    assert (await b.run())[0][0] == "cooldown"
    assert await audit(state, GEO) == []


async def test_a_lost_node_requeues_its_jobs_and_a_reregistration_heals_it(state: RedisState) -> None:
    now = time.time()
    assert (await state.reserve(res("j1", "1g.5gb", 6, ver=1), now)).ok
    lost = await state.node_lost("n1", now, "heartbeats stopped")
    assert lost["requeued"] == ["j1"]
    g0, _g1 = await state.get_gpus(["n1/0", "n1/1"])
    assert g0 is not None and not g0.healthy and g0.instances == []
    assert (await state.job("j1")).state == "pending"  # type: ignore[union-attr]
    assert (await state.node_lost("n1", now, "again"))["requeued"] == []
    await state.register_node("n1", [gpu(0), gpu(1)], now)
    (g0,) = await state.get_gpus(["n1/0"])
    assert g0 is not None and g0.healthy
    assert (await state.nodes())["n1"]["state"] == "up"
    assert await audit(state, GEO) == []


async def test_a_batch_of_transitions_is_one_round_trip_with_one_result_each(state: RedisState) -> None:
    now = time.time()
    b = state.batch()
    i = b.reserve(res("a", "1g.5gb", 6, ver=1), now)
    j = b.reserve(res("b", "1g.5gb", 5, ver=2), now)
    k = b.reserve(res("c", "1g.5gb", 4, ver=2), now)  # stale: 'b' moved the version to 3
    q = b.enqueue("d", b"{}", 0, 1.0, "no room", now)
    out = await b.run()
    assert out[i].ok and out[j].ok and out[k].status == "conflict" and out[q] == "queued"


async def test_a_release_does_not_invalidate_a_reservation_decided_before_it(state: RedisState) -> None:
    now = time.time()
    assert (await state.reserve(res("a", "1g.5gb", 6, ver=1), now)).ok  # claim version 2
    await state.release("a", "completed", "", now)  # frees: the claim version stays 2
    assert (await state.reserve(res("b", "1g.5gb", 5, ver=2), now)).ok
    assert await state.instance("retire", "n1", "n1/0", "n1/0:1g.5gb@6:a", now) == "ok"  # claims: version 4
    assert (await state.reserve(res("c", "1g.5gb", 4, ver=3), now)).status == "conflict"
    assert await audit(state, GEO) == []


async def test_a_redelivered_registration_changes_nothing_but_a_new_one_is_applied(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    st = RedisState.from_settings(make_settings(prefix, nats_url, redis_url))
    await st.register_node("n1", [gpu(0)], time.time(), "reg-1")
    try:
        assert (await st.reserve(res("j1", "3g.20gb", 0, ver=1), time.time())).ok
        await st.mark_running("j1", "n1/0:3g.20gb@0:j1", time.time())
        await st.release("j1", "completed", "done", time.time())
        again = await st.register_node("n1", [gpu(0)], time.time(), "reg-1")
        assert again["replay"] is True and again["gpus"] == ["n1/0"]
        (g,) = await st.get_gpus(["n1/0"])
        assert g is not None and [(i.id, i.state) for i in g.instances] == [("n1/0:3g.20gb@0:j1", "idle")]
        fresh = await st.register_node("n1", [gpu(0)], time.time(), "reg-2")  # new: unreported = gone
        assert "replay" not in fresh
        (g,) = await st.get_gpus(["n1/0"])
        assert g is not None and g.instances == []
        assert await audit(st, GEO) == []
    finally:
        await st.wipe()
        await st.close()


async def test_a_job_history_keeps_its_last_64_entries(state: RedisState) -> None:
    now = time.time()
    assert (await state.reserve(res("j1", "1g.5gb", 6, ver=1), now)).ok
    assert await state.mark_running("j1", "n1/0:1g.5gb@6:j1", now) == "ok"
    for n in range(70):  # each cancel request on a running job is one more entry
        assert (await state.cancel("j1", f"ask {n}", now + n)).status == "stop"
    hist = await state.history("j1")
    assert len(hist) == 64
    assert hist[0].reason == "cancel requested: ask 6" and hist[-1].reason == "cancel requested: ask 69"
    assert await audit(state, GEO) == []


async def test_a_job_deleted_by_hand_and_submitted_again_is_no_longer_listed_as_ended(state: RedisState) -> None:
    now = time.time()
    assert (await state.reserve(res("j1", "1g.5gb", 6, ver=1), now)).ok
    assert (await state.release("j1", "completed", "exit 0", now)).state == "finished"
    k = state.keys(0)
    assert await state.redis.zscore(k.done, "j1") is not None
    await state.redis.delete(k.job("j1"), k.hist("j1"))  # an operator's clean-up that left the ended list alone
    assert await state.enqueue("j1", b"{}", 0, now, "submitted again", now + 1) == "queued"
    assert await state.redis.zscore(k.done, "j1") is None  # the retention sweep must not delete it
    # a pending job leaving for placing is never listed either
    assert (await state.reserve(res("j1", "1g.5gb", 5, ver=2), now + 2)).ok
    assert await state.redis.zscore(k.done, "j1") is None


async def test_the_history_lives_in_the_job_hash_after_an_older_versions_list(state: RedisState) -> None:
    now = time.time()
    k = state.keys(0)
    # an older version wrote j1's first entry to a list of its own
    old = '{"at": 1.0, "from": "", "to": "pending", "reason": "queued by an older version"}'
    await state.redis.rpush(k.hist("j1"), old)
    await state.redis.hset(k.job("j1"), mapping={"state": "pending", "prio": 0, "at": 1.0, "attempts": 0})
    await state.redis.zadd(k.pending, {"j1": 1.0})
    assert (await state.reserve(res("j1", "1g.5gb", 6, ver=1), now)).ok
    assert await state.mark_running("j1", "n1/0:1g.5gb@6:j1", now) == "ok"
    hist = await state.history("j1")
    assert [(h.prev, h.to) for h in hist] == [("", "pending"), ("pending", "placing"), ("placing", "running")]
    assert await state.redis.llen(k.hist("j1")) == 1  # nothing more went to the list
    assert await state.redis.hget(k.job("j1"), "hn") == b"2"
    # a job written now has no list at all
    assert (await state.reserve(res("j2", "1g.5gb", 5, ver=2), now)).ok
    assert not await state.redis.exists(k.hist("j2"))
    assert [h.to for h in await state.history("j2")] == ["placing"]
