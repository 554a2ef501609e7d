"""The default policy: its vectorised rule against the plain loop, legality, and the behaviours it is built for
(keep empty GPUs, align expected ends, explain itself)."""

from __future__ import annotations

import math
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mig_strategies import GEO, clusters
from reference_migsched import choose, choose_gang

from shared.mig.occupancy import span
from shared.policy.placement.alignment import Context, Group, exact_keys, group
from shared.policy.placement.decision import CannotPlace, JobRequest, Placement
from shared.policy.placement.plugins import migsched
from shared.policy.placement.plugins.migsched import AlignParams, bucket, buckets, place_aligned
from shared.policy.request import Demand, mig
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of

pytestmark = pytest.mark.unit

DEMANDS = st.sampled_from(["1g", "2g", "3g", "4g", "7g", "1g+me", "1g.10gb", "2g.20gb"]).map(mig)
PARAMS = st.builds(
    AlignParams, keep_empty=st.sampled_from([0.0, 0.1, 0.5, 1.0]), spread=st.booleans(),
    fit_steps=st.sampled_from([0.0, 5.0, 20.0]), in_time=st.booleans(), node_first=st.booleans(),
    top_k=st.integers(0, 3), gang_hours=st.sampled_from([0.0, 4.0]), minute_s=st.sampled_from([60.0, 0.03]),
)
HINTS = st.one_of(st.none(), st.sampled_from([30.0, 600.0, 5000.0, 100000.0]))
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(snap=clusters(), demand=DEMANDS, params=PARAMS, hint=HINTS, now=st.sampled_from([None, 1000.0]))
def test_the_vectorised_rule_picks_what_the_plain_loop_picks(
    snap: ClusterSnapshot, demand: Demand, params: AlignParams, hint: float | None, now: float | None
) -> None:
    job = JobRequest(job_id="j", demand=demand, duration_hint_s=hint, now=now)
    d = place_aligned(snap, job, params=params)
    want = choose(snap, job, params)
    got = None if isinstance(d, CannotPlace) else (d.slot.gpu_id, d.slot.start, d.slot.action)
    assert got == want


@FAST
@given(snap=clusters(), demand=DEMANDS, params=PARAMS, hint=HINTS)
def test_runners_up_from_the_best_class_alone_are_those_every_full_key_gives(
    snap: ClusterSnapshot, demand: Demand, params: AlignParams, hint: float | None
) -> None:
    # a decision computes full keys for its best (tier, fit) class only; the runners-up must not notice
    job = JobRequest(job_id="j", demand=demand, duration_hint_s=hint, now=1000.0)
    fast = place_aligned(snap, job, params=params)

    def every_key(snap: ClusterSnapshot, ctx: Context, params: AlignParams, *rest: Any) -> Group:
        g = group(snap, ctx, params, *rest)
        exact_keys(ctx, params, g)
        return g

    with patch.object(migsched, "group", every_key):
        full = place_aligned(snap, job, params=params)
    assert fast == full


@FAST
@given(snap=clusters(), n=st.integers(1, 4), params=PARAMS, hint=HINTS, now=st.sampled_from([None, 1000.0]))
def test_a_one_node_gang_goes_where_the_plain_loop_sends_it(
    snap: ClusterSnapshot, n: int, params: AlignParams, hint: float | None, now: float | None
) -> None:
    job = JobRequest(job_id="j", demand=Demand(kind="gpus", gpus=n), duration_hint_s=hint, now=now)
    rule = migsched.rules(params).gang
    assert rule is not None
    d = rule(snap, job)
    want = choose_gang(snap, job, params)
    if want is None:
        assert isinstance(d, CannotPlace) and d.reasons
        return
    assert isinstance(d, Placement) and len(d.slots) == n
    assert {snap.gpu(s.gpu_id).node for s in d.slots} == {want}
    assert all(snap.gpu(s.gpu_id).busy_mask == 0 for s in d.slots)


@FAST
@given(snap=clusters(), demand=DEMANDS, hint=HINTS)
def test_a_placement_is_legal_and_explains_itself(snap: ClusterSnapshot, demand: Demand, hint: float | None) -> None:
    d = place_aligned(snap, JobRequest(job_id="j", demand=demand, duration_hint_s=hint, now=1000.0))
    if isinstance(d, CannotPlace):
        assert d.reasons
        return
    slot = d.slot
    gpu = snap.gpu(slot.gpu_id)
    assert gpu.mig and gpu.healthy
    prof = GEO.model(gpu.model).profile(slot.profile)
    assert slot.start in prof.placements
    assert not gpu.busy_mask & span(prof.memory_slices, slot.start)
    if slot.action == "reuse":
        inst = gpu.instance(slot.instance_id or "")
        assert inst is not None and not inst.busy and inst.profile == slot.profile
    assert any(r.startswith("score ") for r in d.reasons)
    assert all(c.gpu_id != slot.gpu_id for c in d.candidates)


def _gpu(gid: str, node: str, *busy: tuple[str, int, float]) -> GpuView:
    insts = [InstanceView(id=f"{gid}/{k}", profile=p, start=s, size=GEO.model("A100-40GB").profile(p).memory_slices,
                          compute=GEO.model("A100-40GB").profile(p).compute_slices, job_id=f"{gid}/j{k}", ends_at=e)
             for k, (p, s, e) in enumerate(busy)]
    return GpuView.build(id=gid, node=node, index=int(gid[1:]), model="A100-40GB", instances=insts)


def test_a_small_job_goes_beside_running_jobs_rather_than_opening_an_empty_gpu() -> None:
    snap = snapshot_of(GEO, [_gpu("g0", "n0"), _gpu("g1", "n0", ("3g.20gb", 4, 2000.0))])
    d = place_aligned(snap, JobRequest(job_id="j", demand=mig("1g"), duration_hint_s=100.0, now=0.0),
                      params=AlignParams(keep_empty=1.0))
    assert isinstance(d, Placement) and d.slot.gpu_id == "g1"


def test_a_short_job_goes_where_the_running_jobs_outlast_it() -> None:
    # both fit a 1g alike; g0's job ends in 100 s, g1's in 10,000 s: a 1,000-s job extends only g0's busy time
    snap = snapshot_of(GEO, [_gpu("g0", "n0", ("3g.20gb", 4, 100.0)), _gpu("g1", "n1", ("3g.20gb", 4, 10000.0))])
    d = place_aligned(snap, JobRequest(job_id="j", demand=mig("1g"), duration_hint_s=1000.0, now=0.0),
                      params=AlignParams(keep_empty=1.0))
    assert isinstance(d, Placement) and d.slot.gpu_id == "g1"
    # without a hint, time says nothing and the snapshot order decides
    d = place_aligned(snap, JobRequest(job_id="j", demand=mig("1g"), now=0.0), params=AlignParams(keep_empty=1.0))
    assert isinstance(d, Placement) and d.slot.gpu_id == "g0"


def test_while_empty_gpus_are_plenty_a_job_goes_to_the_least_loaded_gpu() -> None:
    gpus = [_gpu("g0", "n0", ("3g.20gb", 4, 100.0))] + [_gpu(f"g{i}", "n1") for i in range(1, 8)]
    d = place_aligned(snapshot_of(GEO, gpus), JobRequest(job_id="j", demand=mig("1g"), now=0.0),
                      params=AlignParams(keep_empty=0.5))
    assert isinstance(d, Placement) and d.slot.gpu_id != "g0"


def test_a_gang_takes_the_node_whose_busy_time_it_extends_least() -> None:
    # n0 and n1 each have two empty GPUs; n0's other GPU is busy for 10 s, n1's for 10,000 s
    gpus = [_gpu("g0", "n0", ("3g.20gb", 4, 10.0)), _gpu("g1", "n0"), _gpu("g2", "n0"),
            _gpu("g3", "n1", ("3g.20gb", 4, 10000.0)), _gpu("g4", "n1"), _gpu("g5", "n1")]
    job = JobRequest(job_id="j", demand=Demand(kind="gpus", gpus=2), duration_hint_s=5000.0, now=0.0)
    d = place_aligned(snapshot_of(GEO, gpus), job)
    assert isinstance(d, Placement) and {s.gpu_id for s in d.slots} == {"g4", "g5"}


def test_buckets_agree_with_bucket_on_every_kind_of_extension() -> None:
    import numpy as np

    xs = [-5.0, 0.0, 1.0, 59.0, 60.0, 61.0, 3600.0, 1e6, math.inf]
    assert buckets(np.array(xs)).tolist() == [bucket(x) for x in xs]
    # a replay at 2000x: the same buckets, on a clock 2000 times faster
    assert buckets(np.array(xs) / 2000, 60.0 / 2000).tolist() == [bucket(x) for x in xs]
