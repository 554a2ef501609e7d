"""The preempting reservation against a real Redis: victims checked, evicted and re-queued in the same
script as the new job's compare-and-set reservation, or nothing written at all."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import msgspec
import pytest

from services.common.testing import make_settings
from shared.mig.geometry import default_geometry
from shared.state import Eviction, RedisState, Reservation, StoredInstance, audit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]
GEO = default_geometry()
A100 = GEO.model("A100-40GB")


@pytest.fixture
async def state(prefix: str, redis_url: str, nats_url: str) -> AsyncIterator[RedisState]:
    st = RedisState.from_settings(make_settings(prefix, nats_url, redis_url))
    gpu = {
        "id": "n1/0",
        "index": 0,
        "model": "A100-40GB",
        "mig": True,
        "healthy": True,
        "uuid": "",
        "instances": [],
    }
    await st.register_node("n1", [gpu], time.time())
    yield st
    await st.wipe()
    await st.close()


def res(job: str, profile: str, start: int, ver: int, **kw: object) -> Reservation:
    p = A100.profile(profile)
    inst = StoredInstance(
        id=f"n1/0:{profile}@{start}:{job}",
        profile=profile,
        start=start,
        size=p.memory_slices,
        compute=p.compute_slices,
    )
    base = Reservation(
        job_id=job,
        gpu_id="n1/0",
        expected_ver=ver,
        instance=inst,
        action="create",
        max_count=p.max_count,
        spec=b"{}",
        prio=0,
        submitted_at=10.0,
        reason="test",
    )
    return msgspec.structs.replace(base, **kw)


async def _running(state: RedisState, job: str, start: int, ver: int, pre: bool = True) -> None:
    r = res(job, "3g.20gb", start, ver, prio=1, submitted_at=5.0 + start)
    r.instance.pre = pre
    assert (await state.reserve(r, time.time())).ok
    assert await state.mark_running(job, r.instance.id, time.time()) == "ok"


async def test_a_preempting_reservation_requeues_the_victim_and_takes_its_slices(state: RedisState) -> None:
    await _running(state, "low", 4, ver=1)
    victim = Eviction(
        job_id="low", instance_id="n1/0:3g.20gb@4:low", reason="preempted by high: priority 1 < 9"
    )
    r = res(
        "high",
        "7g.40gb",
        0,
        ver=2,
        prio=9,
        destroy=("n1/0:3g.20gb@4:low",),
        victims=(victim,),
        tenant="team-a",
        usage={"compute_slices": 7.0},
    )
    got = await state.reserve(r, time.time())
    assert got.ok, got
    low = await state.job("low")
    assert low is not None and low.state == "pending" and low.gpu == "" and low.at == 9.0
    assert (await state.history("low"))[-1].reason == "preempted by high: priority 1 < 9"
    assert "low" in await state.pending_ids(0)
    (g,) = await state.get_gpus(["n1/0"])
    assert g is not None and [i.job for i in g.instances] == ["high"]
    raw = await state.redis.hgetall(state.job_keys("high").job("high"))
    assert raw[b"tenant"] == b"team-a" and msgspec.json.decode(raw[b"usage"]) == {"compute_slices": 7.0}
    assert g.busy_mask == 0xFF
    assert await audit(state, GEO) == []


async def test_a_victim_that_is_not_running_any_more_refuses_the_whole_transition(state: RedisState) -> None:
    await _running(state, "low", 4, ver=1)
    await state.release("low", "completed", "done", time.time())
    victim = Eviction(job_id="low", instance_id="n1/0:3g.20gb@4:low", reason="preempted by high")
    got = await state.reserve(res("high", "7g.40gb", 0, ver=2, victims=(victim,)), time.time())
    assert got.status == "victim"
    assert await state.job("high") is None
    assert (await state.job("low")).state == "finished"  # type: ignore[union-attr]


async def test_a_non_preemptible_job_is_never_evicted(state: RedisState) -> None:
    await _running(state, "pinned", 4, ver=1, pre=False)
    victim = Eviction(job_id="pinned", instance_id="n1/0:3g.20gb@4:pinned", reason="preempted by high")
    r = res("high", "7g.40gb", 0, ver=2, destroy=("n1/0:3g.20gb@4:pinned",), victims=(victim,))
    got = await state.reserve(r, time.time())
    assert got.status == "victim"
    assert (await state.job("pinned")).state == "running"  # type: ignore[union-attr]
    (g,) = await state.get_gpus(["n1/0"])
    assert g is not None and g.instances[0].view().preemptible is False


async def test_a_failed_check_after_the_victims_leaves_them_running(state: RedisState) -> None:
    await _running(state, "low", 4, ver=1)
    victim = Eviction(job_id="low", instance_id="n1/0:3g.20gb@4:low", reason="preempted by high")
    # the slot overlaps the victim but does not list it for destruction: 'overlap', and nothing written
    got = await state.reserve(res("high", "7g.40gb", 0, ver=2, victims=(victim,)), time.time())
    assert got.status == "overlap"
    assert (await state.job("low")).state == "running"  # type: ignore[union-attr]
    assert await state.job("high") is None
    assert await audit(state, GEO) == []
