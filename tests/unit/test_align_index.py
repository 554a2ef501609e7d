"""The simulator's incremental ``migsched`` index chooses exactly what the policy chooses over a snapshot of the
same GPUs, through any sequence of changes."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mig_strategies import GEO, MODELS, change_gpu, gang_step, random_cluster

from shared.policy.partition import PartitionPlan, plan_partition
from shared.policy.placement.align_index import AlignIndex
from shared.policy.placement.alignment import AlignParams
from shared.policy.placement.decision import JobRequest, Placement, Slot
from shared.policy.placement.plugins.migsched import place_aligned
from shared.policy.request import Demand, mig, sized
from shared.policy.snapshot import GpuView, InstanceView, snapshot_of

pytestmark = pytest.mark.unit

DEMANDS = st.one_of(
    st.sampled_from(["1g", "2g", "3g", "4g", "7g", "1g.2x", "1g+me", "2g+me", "1g.5gb", "3g.71gb"]).map(mig),
    st.builds(sized, st.integers(1, 7), st.floats(1, 150)),
)
PARAMS = st.builds(AlignParams, fit_steps=st.sampled_from([5.0, 20.0]), in_time=st.booleans(),
                   node_first=st.booleans(), top_k=st.sampled_from([0, 0, 1, 3, 6]),
                   minute_s=st.sampled_from([60.0, 0.03]))
HINTS = st.sampled_from([None, 30.0, 600.0, 7200.0, 200000.0])
STEP = st.tuples(st.sampled_from(["place", "place", "place", "release", "destroy", "health", "later"]), DEMANDS,
                 HINTS, st.integers(0, 2**16))


def _apply(gpus: list[GpuView], index: AlignIndex, slot: Slot, job: str, ends_at: float | None) -> None:
    p = next(p for p, g in enumerate(gpus) if g.id == slot.gpu_id)
    gpu = gpus[p]
    plan = plan_partition(gpu, GEO.model(gpu.model), slot, job)
    assert isinstance(plan, PartitionPlan)
    destroyed = {op.instance_id for op in plan.ops if op.kind == "destroy_gi"}
    keep = [i for i in gpu.instances if i.id not in destroyed and i.id != plan.instance_id]
    prof = GEO.model(gpu.model).profile(slot.profile)
    inst = InstanceView(id=plan.instance_id, profile=prof.name, start=slot.start, size=prof.memory_slices,
                        compute=prof.compute_slices, job_id=job, ends_at=ends_at)
    gpus[p] = gpu.with_instances([*keep, inst])
    index.update(gpus[p])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 12),
       models=st.lists(st.sampled_from(MODELS), min_size=1, max_size=3, unique=True),
       params=PARAMS, steps=st.lists(STEP, min_size=1, max_size=25), cached=st.sampled_from([1, 3, 64]),
       few=st.sampled_from([0, 2, 16]))
def test_the_index_places_exactly_as_the_policy_through_a_sequence_of_changes(
    seed: int, n: int, models: list[str], params: AlignParams,
    steps: list[tuple[str, Demand, float | None, int]], cached: int, few: int,
) -> None:
    gpus = list(random_cluster(random.Random(seed), n, tuple(models)).gpus)
    index = AlignIndex(GEO, gpus, params)
    index.columns.min_size = cached  # small: the kept columns of large classes are exercised on small clusters
    index.few = few  # and both ways of keying a decision's best classes: one GPU at a time, or as arrays
    now = 1000.0
    for k, (what, demand, hint, pick) in enumerate(steps):
        if what == "later":  # the clock moves: running jobs' expected ends come nearer or pass
            now += float(pick % 5000)
        elif what == "place":
            job = JobRequest(job_id=f"j{k}", demand=demand, duration_hint_s=hint, now=now)
            decision = place_aligned(snapshot_of(GEO, gpus), job, params=params)
            slots = index.place(demand, hint, now)
            explained = index.decide(job, "migsched")
            if not isinstance(decision, Placement):
                assert slots is None and explained is None
                continue
            assert slots == decision.slots
            assert explained == decision  # reasons, score and runners-up too (msgspec compares every field)
            _apply(gpus, index, slots[0], f"j{k}", None if hint is None else now + hint)
        else:
            p = pick % len(gpus)
            gpus[p] = change_gpu(gpus[p], what, pick // len(gpus))
            index.update(gpus[p])
    assert index.agrees_with(gpus)  # what a fresh index over the same GPUs keys
    snap = snapshot_of(GEO, gpus)  # and the time columns are the snapshot's
    ends, node_end, node_empty, _ = index.times.columns  # up to date: agrees_with flushed them
    assert np.array_equal(ends, snap.ends) and np.array_equal(node_end, snap.node_end)
    assert np.array_equal(node_empty, snap.node_empty)


@pytest.mark.parametrize("seed", range(12))
def test_on_busy_nodes_with_hints_the_index_keys_time_as_the_policy_does(seed: int) -> None:
    # jobs with hints on 8-GPU nodes, so that the GPU's and the node's extensions differ and the time fields
    # decide: the index's best classes keyed one GPU at a time, and as arrays, against the policy's snapshot
    rng = random.Random(seed)
    gpus = [GpuView.build(id=f"g{i}", node=f"n{i // 8}", index=i % 8, model="A100-40GB", instances=[])
            for i in range(32)]
    params = AlignParams(node_first=bool(seed % 2), minute_s=(60.0, 0.03)[seed % 3 == 2], top_k=0)
    one, arrays = AlignIndex(GEO, gpus, params), AlignIndex(GEO, gpus, params)
    arrays.few = 0
    now, agreed, timed = 1000.0, 0, 0
    for k in range(150):
        if rng.random() < 0.3:
            p = rng.randrange(len(gpus))
            gpus[p] = change_gpu(gpus[p], "release", rng.randrange(8))
            one.update(gpus[p])
            arrays.update(gpus[p])
            continue
        now += rng.choice([0.0, 5.0, 90.0, 1200.0])
        demand = mig(rng.choice(["1g", "1g", "2g", "3g", "4g"]))
        hint = rng.choice([20.0, 300.0, 4000.0, 90000.0, None])
        decision = place_aligned(snapshot_of(GEO, gpus), JobRequest(job_id=f"j{k}", demand=demand,
                                                                    duration_hint_s=hint, now=now), params=params)
        slots, by_arrays = one.place(demand, hint, now), arrays.place(demand, hint, now)
        if not isinstance(decision, Placement):
            assert slots is None and by_arrays is None
            continue
        assert slots == by_arrays == decision.slots
        agreed += 1
        timed += hint is not None and len({g.node for g in gpus if g.busy_mask}) > 1
        _apply(gpus, one, slots[0], f"j{k}", None if hint is None else now + hint)
        arrays.update(gpus[next(p for p, g in enumerate(gpus) if g.id == slots[0].gpu_id)])
    assert agreed >= 50 and timed >= 20  # the sequence really compared timed choices on several nodes


def test_among_equal_gpus_the_index_picks_the_one_listed_first() -> None:
    gpus = [GpuView.build(id=f"g{i}", node=f"n{i}", index=0, model="A100-40GB", instances=[]) for i in range(3)]
    index = AlignIndex(GEO, gpus, AlignParams())
    slots = index.place(mig("7g"), 60.0, 0.0)
    assert slots is not None and slots[0].gpu_id == "g0"


def test_a_gpu_changed_after_a_decision_is_keyed_again_before_the_next_one() -> None:
    gpus = [GpuView.build(id=f"g{i}", node="n0", index=i, model="A100-40GB", instances=[]) for i in range(2)]
    index = AlignIndex(GEO, gpus, AlignParams())
    first = index.place(mig("7g"), 60.0, 0.0)
    assert first is not None and first[0].gpu_id == "g0"
    _apply(gpus, index, first[0], "j0", 60.0)
    second = index.place(mig("7g"), 60.0, 0.0)
    assert second is not None and second[0].gpu_id == "g1"
    _apply(gpus, index, second[0], "j1", 60.0)
    assert index.place(mig("7g"), 60.0, 0.0) is None


def test_a_short_job_goes_beside_jobs_that_outlast_it_as_the_policy_puts_it() -> None:
    soon = InstanceView(id="a/i0", profile="3g.20gb", start=4, size=4, compute=3, job_id="a", ends_at=100.0)
    late = InstanceView(id="b/i0", profile="3g.20gb", start=4, size=4, compute=3, job_id="b", ends_at=90000.0)
    gpus = [GpuView.build(id="g0", node="n0", index=0, model="A100-40GB", instances=[soon]),
            GpuView.build(id="g1", node="n1", index=0, model="A100-40GB", instances=[late])]
    index = AlignIndex(GEO, gpus, AlignParams())
    slots = index.place(mig("3g"), 3600.0, 0.0)
    assert slots is not None and slots[0].gpu_id == "g1"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 24), odd=st.sampled_from([0.0, 0.05]),
       steps=st.lists(st.tuples(st.sampled_from(["1", "2", "4", "1g", "release", "destroy", "health", "later"]),
                                HINTS, st.integers(0, 2**16)), min_size=1, max_size=25))
def test_whole_gpu_gangs_go_where_the_policy_puts_them_while_every_gpu_is_in_mig_mode(
    seed: int, n: int, odd: float, steps: list[tuple[str, float | None, int]]
) -> None:
    gpus = list(random_cluster(random.Random(seed), n, ("A100-40GB", "H100-80GB"), odd_share=odd).gpus)
    index = AlignIndex(GEO, gpus, AlignParams())
    now = 1000.0
    for k, (what, hint, pick) in enumerate(steps):
        if what == "later":
            now += float(pick % 5000)
            continue
        demand = gang_step(gpus, index, what, pick)
        if demand is None:
            continue
        # waited 0-10,000 s: a long gang is kept waiting for headroom until 7,200 s (long_gangs)
        job = JobRequest(job_id=f"j{k}", demand=demand, duration_hint_s=hint, now=now,
                         submitted_at=now - float(pick % 10000))
        decision = place_aligned(snapshot_of(GEO, gpus), job)
        slots = index.place(demand, hint, now, job.submitted_at)
        assert slots == (decision.slots if isinstance(decision, Placement) else None)
        assert index.decide(job, "migsched") == (decision if isinstance(decision, Placement) else None)
        for slot in slots or ():
            _apply(gpus, index, slot, f"j{k}", None if hint is None else now + hint)
        empty_by_node = Counter(g.node for g in gpus if g.mig and g.healthy and not g.busy_mask)
        assert all(index.empty_on(g.node) == empty_by_node[g.node] for g in gpus)
    assert index.agrees_with(gpus)


def _as_the_policy(gpus: list[GpuView], demand: Demand, hint: float, now: float) -> Slot:
    """The index's slot, checked to be the policy's over a snapshot of the same GPUs."""
    decision = place_aligned(snapshot_of(GEO, gpus), JobRequest(job_id="j", demand=demand, duration_hint_s=hint,
                                                                now=now))
    assert isinstance(decision, Placement)
    assert AlignIndex(GEO, gpus, AlignParams()).place(demand, hint, now) == decision.slots
    return decision.slots[0]


def test_of_equal_gpus_the_one_whose_node_has_fewest_empty_gpus_is_taken() -> None:
    def busy(gid: str) -> InstanceView:
        return InstanceView(id=f"{gid}/i0", profile="3g.20gb", start=4, size=4, compute=3, job_id=gid,
                            ends_at=5000.0)

    gpus = [GpuView.build(id="g0", node="n0", index=0, model="A100-40GB", instances=[busy("g0")]),
            GpuView.build(id="g1", node="n0", index=1, model="A100-40GB", instances=[]),
            GpuView.build(id="g2", node="n1", index=0, model="A100-40GB", instances=[busy("g2")])]
    assert _as_the_policy(gpus, mig("3g"), 3600.0, 0.0).gpu_id == "g2"


def test_a_best_candidate_at_its_max_count_yields_to_a_gpu_of_another_class_as_in_the_policy() -> None:
    def inst(gid: str, n: int, profile: str, start: int, size: int, job: bool, ends_at: float | None
             ) -> InstanceView:
        prof = GEO.model("A100-40GB").profile(profile)
        return InstanceView(id=f"{gid}/i{n}", profile=prof.name, start=start, size=size,
                            compute=prof.compute_slices, job_id=f"{gid}/j{n}" if job else None, ends_at=ends_at)

    gpus = [  # g2 ranks first for 1g+me, but already runs the one +me instance an A100 may hold
        GpuView.build(id="g0", node="n0", index=0, model="A100-40GB",
                      instances=[inst("g0", 0, "1g.5gb", 3, 1, False, None)]),
        GpuView.build(id="g1", node="n0", index=1, model="A100-40GB",
                      instances=[inst("g1", 0, "1g.10gb", 4, 2, True, 1600.0)]),
        GpuView.build(id="g2", node="n0", index=2, model="A100-40GB",
                      instances=[inst("g2", 1, "1g.5gb+me", 1, 1, True, None),
                                 inst("g2", 2, "1g.10gb", 2, 2, True, 1060.0),
                                 inst("g2", 0, "3g.20gb", 4, 4, True, 4600.0)]),
    ]
    assert _as_the_policy(gpus, mig("1g.5gb+me"), 600.0, 1000.0).gpu_id == "g1"


def test_parameters_whose_leading_fields_follow_the_load_are_refused() -> None:
    assert not AlignIndex.supports(AlignParams(spread=True))
    assert not AlignIndex.supports(AlignParams(keep_empty=0.1))
    with pytest.raises(ValueError, match="depend on the load"):
        AlignIndex(GEO, [], AlignParams(spread=True))


def test_runners_up_among_many_equal_gpus_are_the_first_listed_as_the_policy_lists_them() -> None:
    gpus = [GpuView.build(id=f"g{i}", node=f"n{i // 8}", index=i % 8, model="H100-80GB") for i in range(200)]
    params = AlignParams(top_k=3)
    index = AlignIndex(GEO, gpus, params)
    for k in range(12):  # ties everywhere: the list must follow (key, position), not how rows are laid out
        job = JobRequest(job_id=f"j{k}", demand=mig("1g" if k % 3 else "3g"), duration_hint_s=600.0, now=0.0)
        decision = place_aligned(snapshot_of(GEO, gpus), job, params=params)
        assert isinstance(decision, Placement) and len(decision.candidates) == 3
        assert index.decide(job, "migsched") == decision
        _apply(gpus, index, decision.slot, job.job_id, 600.0)
