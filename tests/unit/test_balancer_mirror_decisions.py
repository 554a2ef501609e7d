"""The mirror's decisions (its live placer) are exactly the balancer's, through any sequence of the changes the
balancer service makes to a mirror."""

from __future__ import annotations

import functools
import random

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mig_strategies import GEO, MODELS, random_cluster

import services.balancer.mirror as mirror_module
from services.balancer.mirror import Mirror, reservation_instance
from shared.policy.placement.alignment import AlignParams
from shared.policy.placement.balancer import BalancerParams, place
from shared.policy.placement.decision import CannotPlace, JobRequest, Placement
from shared.policy.placement.registry import get_policy
from shared.policy.request import Demand, mig, sized
from shared.policy.snapshot import GpuView
from shared.state import StoredGpu, StoredInstance

pytestmark = pytest.mark.unit

DEMANDS = st.one_of(
    st.sampled_from(["1g", "2g", "3g", "4g", "7g", "1g.2x", "1g+me", "2g+me", "1g.5gb", "3g.71gb",
                     "2g.12gb"]).map(mig),
    st.builds(sized, st.integers(1, 7), st.floats(1, 150)),
    st.builds(lambda n: Demand(kind="gpus", gpus=n), st.integers(1, 3)),
)
PARAMS = st.builds(
    BalancerParams, threshold=st.sampled_from([0.0, 0.4, 0.6, 1.0]), lazy_first=st.booleans(),
    dynamic=st.booleans(), allow_larger=st.booleans(), top_k=st.integers(0, 4),
    rank=st.sampled_from(["absolute", "delta"]),
)
STEP = st.tuples(
    st.sampled_from(["decide"] * 6 + ["release", "reload", "instances", "health", "add", "remodel", "refresh",
                                       "other params"]),
    DEMANDS, st.integers(0, 2**16),
)


def stored(g: GpuView, ver: int = 0) -> StoredGpu:
    return StoredGpu(
        id=g.id, node=g.node, index=g.index, model=g.model, mig=g.mig, healthy=g.healthy, ver=ver,
        instances=[
            StoredInstance(id=i.id, profile=i.profile, start=i.start, size=i.size, compute=i.compute,
                           state="idle" if i.job_id is None else "busy", job=i.job_id)
            for i in g.instances
        ],
    )


def _empty(n: int, model: str) -> list[GpuView]:
    """Identical empty GPUs: every key ties, where ``place_mig`` cuts runners-up with ``argpartition``."""
    return [GpuView.build(id=f"e{i}", node=f"m{i // 8}", index=i % 8, model=model) for i in range(n)]


def _check(mirror: Mirror, job: JobRequest, params: BalancerParams) -> Placement | CannotPlace:
    expected = place(mirror.view(), job, params)
    got = mirror.decide(job, params)
    assert got == expected  # slots, tier, frags, reasons and candidates (msgspec compares every field)
    return got


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 24), uniform=st.booleans(),
       models=st.lists(st.sampled_from(MODELS), min_size=1, max_size=3, unique=True),
       params=PARAMS, other=PARAMS, steps=st.lists(STEP, min_size=1, max_size=40))
def test_every_mirror_decision_equals_the_balancers_placement_through_random_changes(
    seed: int, n: int, uniform: bool, models: list[str], params: BalancerParams, other: BalancerParams,
    steps: list[tuple[str, Demand, int]],
) -> None:
    rng = random.Random(seed)
    gpus = _empty(n, models[0]) if uniform else list(random_cluster(rng, n, tuple(models)).gpus)
    mirror = Mirror(GEO)
    for g in gpus:
        mirror.put(stored(g, ver=rng.randrange(5)))
    added = 0
    for k, (what, demand, pick) in enumerate(steps):
        ids = list(mirror.vers)
        gid = ids[pick % len(ids)]
        gpu = mirror.get(gid)
        if what in ("decide", "other params"):  # other params: the placer is rebuilt for them
            job = JobRequest(job_id=f"j{k}", demand=demand, priority=pick % 3)
            dec = _check(mirror, job, params if what == "decide" else other)
            if isinstance(dec, Placement):  # reserved at once, as the balancer's pipeline does
                for s in dec.slots:
                    mirror.apply(s, job.job_id, reservation_instance(s, job.job_id, 0, "t", False, True))
        elif what == "release":
            busy = [i for i in gpu.instances if i.job_id is not None]
            if busy:
                inst = busy[pick % len(busy)]
                assert mirror.release(gid, inst.id, inst.job_id or "")
        elif what == "reload":  # a GPU read again from Redis: an idle instance destroyed meanwhile
            idle = [i for i in gpu.instances if i.job_id is None]
            keep = [i for i in gpu.instances if not idle or i is not idle[pick % len(idle)]]
            mirror.put(stored(gpu.with_instances(keep), ver=mirror.vers[gid] + 1))
        elif what == "instances":  # a transition result: the GPU's instances only
            st_gpu = stored(gpu)
            mirror.put_instances(gid, st_gpu.instances[: len(st_gpu.instances) - pick % 2], mirror.vers[gid])
        elif what == "health":
            mirror.put(stored(GpuView.build(id=gpu.id, node=gpu.node, index=gpu.index, model=gpu.model,
                                            mig=gpu.mig, healthy=not gpu.healthy, instances=gpu.instances)))
        elif what == "add":  # a new GPU registers: the placer is rebuilt over the new GPU set
            added += 1
            model = models[pick % len(models)]
            mirror.put(StoredGpu(id=f"new{added}", node=f"x{pick % 2}", index=added, model=model))
        elif what == "remodel":  # the same GPU id reported as another model: the placer is rebuilt
            model = models[pick % len(models)]
            mirror.put(StoredGpu(id=gid, node=gpu.node, index=gpu.index, model=model, ver=mirror.vers[gid] + 1))
        else:  # the periodic full refresh: a fresh mirror from the stored GPUs
            fresh = Mirror(GEO)
            for g_id in ids:
                fresh.put(stored(mirror.get(g_id), ver=mirror.vers[g_id]))
            mirror = fresh


def test_a_mig_decision_with_room_is_made_without_asking_the_balancers_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mirror = Mirror(GEO)
    for g in random_cluster(random.Random(3), 64, ("A100-40GB", "H100-80GB"), odd_share=0.0).gpus:
        mirror.put(stored(g))
    params = BalancerParams(top_k=3)
    job = JobRequest(job_id="j", demand=mig("1g"))
    expected = place(mirror.view(), job, params)
    assert isinstance(expected, Placement) and len(expected.candidates) == 3

    def refuse(*_: object) -> None:
        raise AssertionError("the placer should have answered")

    monkeypatch.setattr(mirror_module, "place", refuse)
    assert mirror.decide(job, params) == expected
    assert mirror.decide(JobRequest(job_id="g", demand=Demand(kind="gpus", gpus=1)), params).slots


def test_a_demand_that_cannot_be_placed_gets_the_balancers_reasons() -> None:
    mirror = Mirror(GEO)
    full = StoredInstance(id="x", profile="7g.40gb", start=0, size=8, compute=7, state="busy", job="busy")
    mirror.put(StoredGpu(id="g0", node="n", index=0, model="A100-40GB", instances=[full]))
    dec = mirror.decide(JobRequest(job_id="j", demand=mig("1g")), BalancerParams())
    assert isinstance(dec, CannotPlace) and dec.reasons == ("1 GPU(s): no free 1g.5gb placement",)


def test_runners_up_among_hundreds_of_equal_gpus_are_the_ones_the_balancer_lists() -> None:
    mirror = Mirror(GEO)
    for g in _empty(300, "H100-80GB"):
        mirror.put(stored(g))
    params = BalancerParams(top_k=3)
    for k in range(20):  # ties everywhere: argpartition's pick among equal keys decides the runners-up
        job = JobRequest(job_id=f"j{k}", demand=mig("1g" if k % 3 else "3g"))
        dec = _check(mirror, job, params)
        assert isinstance(dec, Placement) and len(dec.candidates) == 3
        mirror.apply(dec.slot, job.job_id, reservation_instance(dec.slot, job.job_id, 0, "t", False, True))


def test_a_reload_of_the_same_gpus_updates_only_the_drifted_ones_and_keeps_deciding_as_place() -> None:
    gpus = _empty(16, "A100-40GB")
    mirror = Mirror(GEO)
    for g in gpus:
        mirror.put(stored(g, ver=3))
    params = BalancerParams()
    job = JobRequest(job_id="j", demand=mig("1g"))
    _check(mirror, job, params)
    placer = mirror._placer
    assert mirror.holds_exactly([g.id for g in gpus]) and not mirror.holds_exactly([g.id for g in gpus[:-1]])
    assert not any(mirror.refresh(stored(g, ver=3)) for g in gpus)  # nothing drifted: nothing re-put
    g5 = gpus[5]
    busy = StoredGpu(
        id=g5.id, node=g5.node, index=g5.index, model=g5.model, ver=4,
        instances=[StoredInstance(id="e5:3g@0", profile="3g.20gb", start=0, size=4, compute=3, state="busy",
                                  job="other")],
    )
    assert mirror.refresh(busy)  # another service's reservation: the mirror takes it
    assert mirror._placer is placer and mirror.vers["e5"] == 4  # updated in place, not rebuilt
    assert mirror.get("e5").busy_mask != 0
    _check(mirror, job, params)


ALIGN = st.builds(AlignParams, fit_steps=st.sampled_from([5.0, 20.0]), in_time=st.booleans(),
                  node_first=st.booleans(), top_k=st.integers(0, 4))
HINTS = st.sampled_from([None, 30.0, 600.0, 7200.0])


def _timed(g: GpuView, ver: int = 0) -> StoredGpu:
    """``stored`` with each busy instance's expected end (what ``migsched`` aligns on)."""
    out = stored(g, ver)
    for si, i in zip(out.instances, g.instances, strict=True):
        si.ends = i.ends_at if i.ends_at is not None and i.ends_at > 0 else 0.0
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 24),
       models=st.lists(st.sampled_from(MODELS), min_size=1, max_size=3, unique=True), params=ALIGN,
       steps=st.lists(st.tuples(st.sampled_from(["decide"] * 6 + ["release", "reload", "health", "add", "later"]),
                                DEMANDS, HINTS, st.integers(0, 2**16)), min_size=1, max_size=30))
def test_every_migsched_decision_of_the_mirror_equals_the_policys_over_its_view(
    seed: int, n: int, models: list[str], params: AlignParams,
    steps: list[tuple[str, Demand, float | None, int]],
) -> None:
    rng = random.Random(seed)
    _, policy = get_policy("migsched", **msgspec.structs.asdict(params))
    mirror = Mirror(GEO)
    for g in random_cluster(rng, n, tuple(models)).gpus:
        mirror.put(_timed(g, ver=rng.randrange(5)))
    now, added = 1000.0, 0
    for k, (what, demand, hint, pick) in enumerate(steps):
        ids = list(mirror.vers)
        gid = ids[pick % len(ids)]
        gpu = mirror.get(gid)
        if what == "decide":
            job = JobRequest(job_id=f"j{k}", demand=demand, duration_hint_s=hint, now=now)
            expected = policy(mirror.view(), job)
            dec = mirror.decide(job, BalancerParams(), policy)
            assert dec == expected
            if isinstance(dec, Placement):
                ends = now + hint if hint is not None else 0.0
                for s in dec.slots:
                    mirror.apply(s, job.job_id, reservation_instance(s, job.job_id, 0, "t", False, True, ends))
        elif what == "release":
            busy = [i for i in gpu.instances if i.job_id is not None]
            if busy:
                inst = busy[pick % len(busy)]
                assert mirror.release(gid, inst.id, inst.job_id or "")
        elif what == "reload":
            idle = [i for i in gpu.instances if i.job_id is None]
            keep = [i for i in gpu.instances if not idle or i is not idle[pick % len(idle)]]
            mirror.put(_timed(gpu.with_instances(keep), ver=mirror.vers[gid] + 1))
        elif what == "health":
            mirror.put(_timed(msgspec.structs.replace(gpu, healthy=not gpu.healthy), ver=mirror.vers[gid] + 1))
        elif what == "add":
            added += 1
            mirror.put(StoredGpu(id=f"new{added}", node=f"x{pick % 2}", index=added, model=models[0]))
        else:
            now += float(pick % 5000)


def test_a_migsched_decision_with_room_is_made_by_the_index_without_a_policy_call() -> None:
    mirror = Mirror(GEO)
    for g in random_cluster(random.Random(3), 64, ("A100-40GB", "H100-80GB"), odd_share=0.0).gpus:
        mirror.put(_timed(g))
    _, policy = get_policy("migsched")
    job = JobRequest(job_id="j", demand=mig("1g"), duration_hint_s=600.0, now=1000.0)
    expected = policy(mirror.view(), job)
    assert isinstance(expected, Placement) and len(expected.candidates) == 3
    calls = 0

    def counted(snap: object, j: JobRequest) -> object:
        nonlocal calls
        calls += 1
        return policy(snap, j)  # type: ignore[arg-type]

    functools.update_wrapper(counted, policy)  # the policy's name and parameters, as the registry hands it
    assert mirror.decide(job, BalancerParams(), counted) == expected  # type: ignore[arg-type]
    gang = JobRequest(job_id="g", demand=Demand(kind="gpus", gpus=2), duration_hint_s=600.0, now=1000.0)
    assert mirror.decide(gang, BalancerParams(), counted) == policy(mirror.view(), gang)  # type: ignore[arg-type]
    assert calls == 0
    blocked = mirror.decide(job, BalancerParams(), counted, blocked={expected.slot.gpu_id})  # type: ignore[arg-type]
    assert calls == 1 and isinstance(blocked, Placement) and blocked.slot.gpu_id != expected.slot.gpu_id
