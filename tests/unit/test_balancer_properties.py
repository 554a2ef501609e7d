"""The vectorised balancer against its per-GPU loop, legality of its decisions, and partition plans."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mig_strategies import GEO, clusters, layout_is_legal

from shared.mig.occupancy import span
from shared.policy.partition import PartitionPlan, plan_partition
from shared.policy.placement.balancer import BalancerParams, place, place_mig
from shared.policy.placement.decision import CannotPlace, JobRequest, Placement
from shared.policy.request import Demand, mig, sized
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of
from tests.reference_balancer import place_mig_loop

pytestmark = pytest.mark.unit

DEMANDS = st.one_of(
    st.sampled_from(["1g", "2g", "3g", "4g", "7g", "1g.2x", "1g+me", "1g.5gb", "3g.71gb", "2g.12gb"]).map(
        mig),
    st.builds(sized, st.integers(1, 7), st.floats(1, 150)),
)
PARAMS = st.builds(
    BalancerParams, threshold=st.sampled_from([0.0, 0.4, 0.6, 1.0]), lazy_first=st.booleans(),
    dynamic=st.booleans(), allow_larger=st.booleans(), top_k=st.integers(1, 3),
    rank=st.sampled_from(["absolute", "delta"]),
)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _choice(d: Placement | CannotPlace) -> tuple[str, str, int, str, str | None] | None:
    if isinstance(d, CannotPlace):
        return None
    s = d.slot
    return (s.gpu_id, s.profile, s.start, s.action, s.instance_id)


@FAST
@given(snap=clusters(), demand=DEMANDS, params=PARAMS)
def test_the_vectorised_balancer_and_the_loop_pick_the_same_placement(
    snap: ClusterSnapshot, demand: Demand, params: BalancerParams
) -> None:
    job = JobRequest(job_id="j", demand=demand)
    fast, slow = place_mig(snap, job, params), place_mig_loop(snap, job, params)
    assert _choice(fast) == _choice(slow)
    if isinstance(fast, Placement) and isinstance(slow, Placement):
        assert fast.frag_after == slow.frag_after and fast.tier == slow.tier
        # the explanation starts with the choice
        first, slot = fast.candidates[0], fast.slot
        assert (first.gpu_id, first.start, first.action) == (slot.gpu_id, slot.start, slot.action)
        assert len(fast.candidates) <= max(params.top_k, 1)


@FAST
@given(snap=clusters(), demand=DEMANDS, params=PARAMS)
def test_a_balancer_placement_is_legal_and_its_plan_leaves_a_legal_layout(
    snap: ClusterSnapshot, demand: Demand, params: BalancerParams
) -> None:
    d = place(snap, JobRequest(job_id="j", demand=demand), params)
    if isinstance(d, CannotPlace):
        assert d.reasons
        return
    slot = d.slot
    gpu = snap.gpu(slot.gpu_id)
    model = GEO.model(gpu.model)
    assert gpu.mig and gpu.healthy
    prof = model.profile(slot.profile)
    assert slot.start in prof.placements
    assert not gpu.busy_mask & span(prof.memory_slices, slot.start)
    if slot.action == "reuse":
        inst = gpu.instance(slot.instance_id or "")
        assert inst is not None and not inst.busy
        assert params.allow_larger or inst.profile == demand_profile(demand, model.name)
    else:
        assert params.dynamic
    plan = plan_partition(gpu, model, slot, "j")
    assert isinstance(plan, PartitionPlan)
    _assert_plan_legal(gpu, plan, slot.profile, slot.start)


def demand_profile(demand: Demand, model: str) -> str | None:
    from shared.policy.request import resolve_profile

    p = resolve_profile(demand, GEO.model(model))
    return None if p is None else p.name


def _assert_plan_legal(gpu: GpuView, plan: PartitionPlan, profile: str, start: int) -> None:
    model = GEO.model(gpu.model)
    destroyed = {op.instance_id for op in plan.ops if op.kind == "destroy_gi"}
    for iid in destroyed:
        inst = gpu.instance(iid)
        assert inst is not None and not inst.busy, "a plan destroyed a busy instance"
    kinds = [op.kind for op in plan.ops]
    if "create_gi" in kinds:
        assert kinds.index("create_gi") > max((i for i, k in enumerate(kinds) if k.startswith("destroy")),
                                              default=-1)
        p = model.profile(profile)
        after = [i for i in gpu.instances if i.id not in destroyed] + [
            InstanceView(id=plan.instance_id, profile=profile, start=start, size=p.memory_slices,
                         compute=p.compute_slices, job_id="j")]
        assert layout_is_legal(model, after)


@FAST
@given(snap=clusters(), data=st.data())
def test_a_partition_plan_never_destroys_a_busy_instance(snap: ClusterSnapshot, data: st.DataObject) -> None:
    gpu = data.draw(st.sampled_from(snap.gpus))
    model = GEO.model(gpu.model)
    prof = data.draw(st.sampled_from(model.profiles))
    start = data.draw(st.sampled_from(prof.placements))
    from shared.policy.placement.decision import Slot

    slot = Slot(gpu_id=gpu.id, node=gpu.node, model=model.name, profile=prof.name, start=start,
                size=prof.memory_slices, compute=prof.compute_slices, action="create")
    plan = plan_partition(gpu, model, slot, "j")
    if isinstance(plan, PartitionPlan):
        _assert_plan_legal(gpu, plan, prof.name, start)
    else:
        assert gpu.busy_mask & span(prof.memory_slices, start) or "max count" in plan.reason


def _empty(n: int, model: str = "A100-40GB") -> ClusterSnapshot:
    gpus = [GpuView.build(id=f"g{i}", node="n", index=i, model=model) for i in range(n)]
    return snapshot_of(GEO, gpus)


def test_among_equal_gpus_the_one_listed_first_wins_even_past_the_short_list() -> None:
    snap = _empty(500)
    d = place(snap, JobRequest(job_id="j", demand=mig("1g")))
    assert isinstance(d, Placement) and d.slot.gpu_id == "g0" and d.slot.start == 6


def test_a_gpu_whose_profile_is_at_its_max_count_is_passed_over() -> None:
    # 1g+me has max count 1: every GPU but the last already runs one
    gpus = []
    for i in range(40):
        insts = [InstanceView(id=f"i{i}", profile="1g.5gb+me", start=0, size=1, compute=1, job_id=f"j{i}")]
        gpus.append(GpuView.build(id=f"g{i}", node="n", index=i, model="A100-40GB",
                                  instances=insts if i < 39 else ()))
    snap = snapshot_of(GEO, gpus)
    job = JobRequest(job_id="x", demand=mig("1g+me"))
    d = place(snap, job)
    assert isinstance(d, Placement) and d.slot.gpu_id == "g39"
    assert _choice(place_mig_loop(snap, job, BalancerParams())) == _choice(d)


def test_lazy_gpus_are_preferred_and_busy_ones_used_only_when_no_lazy_one_fits() -> None:
    busy = [InstanceView(id="b", profile="3g.20gb", start=4, size=4, compute=3, job_id="jb")]
    snap = snapshot_of(GEO, [
        GpuView.build(id="busy", node="n", index=0, model="A100-40GB", instances=busy),
        GpuView.build(id="lazy", node="n", index=1, model="A100-40GB",
                      instances=[InstanceView(id="x", profile="4g.20gb", start=0, size=4, compute=4,
                                              job_id=None)]),
    ])
    d = place(snap, JobRequest(job_id="j", demand=mig("2g")))
    assert isinstance(d, Placement) and d.slot.gpu_id == "lazy" and d.tier == "lazy"
    d = place(snap, JobRequest(job_id="j", demand=mig("3g")))
    # lazy GPU: 3g@4 is free; busy GPU: 3g@0 is free too, but lazy wins
    assert isinstance(d, Placement) and d.slot.gpu_id == "lazy"


def test_an_idle_instance_of_the_exact_profile_is_reused_before_creating() -> None:
    idle = [InstanceView(id="idle2g", profile="2g.10gb", start=0, size=2, compute=2)]
    gpu = GpuView.build(id="g", node="n", index=0, model="A100-40GB", instances=idle)
    snap = snapshot_of(GEO, [gpu])
    d = place(snap, JobRequest(job_id="j", demand=mig("2g")))
    assert isinstance(d, Placement) and d.slot.action == "reuse" and d.slot.instance_id == "idle2g"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(max_gpus=30), demand=DEMANDS, data=st.data())
def test_a_snapshot_with_replaced_columns_places_like_the_loop(
    snap: ClusterSnapshot, demand: Demand, data: st.DataObject
) -> None:
    import numpy as np

    sick = np.asarray(data.draw(st.lists(st.booleans(), min_size=len(snap), max_size=len(snap))), dtype=bool)
    held = snap.with_columns(healthy=np.asarray(snap.healthy) & ~sick)
    # built by hand, as other policies do: the fast columns are derived
    bare = ClusterSnapshot(snap.geometry, snap.gpus, busy=snap.busy, idle=snap.idle, used=snap.used,
                           compute=snap.compute, mig=snap.mig, healthy=held.healthy,
                           idle_profiles=snap.idle_profiles, groups=snap.groups, position=snap.position)
    job = JobRequest(job_id="j", demand=demand)
    expected = _choice(place_mig_loop(held, job, BalancerParams()))
    assert _choice(place_mig(held, job, BalancerParams())) == expected
    assert _choice(place_mig(bare, job, BalancerParams())) == expected
    assert expected is None or bool(held.healthy[snap.position[expected[0]]])
