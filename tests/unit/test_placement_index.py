"""The incremental placement index chooses exactly what the balancer chooses, through any sequence of
changes."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mig_strategies import GEO, MODELS, change_gpu, gang_step, random_cluster

from shared.policy.partition import PartitionPlan, plan_partition
from shared.policy.placement.balancer import BalancerParams, place
from shared.policy.placement.decision import JobRequest, Placement, Slot
from shared.policy.placement.index import PlacementIndex
from shared.policy.request import Demand, mig, sized
from shared.policy.snapshot import GpuView, InstanceView, snapshot_of

pytestmark = pytest.mark.unit

DEMANDS = st.one_of(
    st.sampled_from(["1g", "2g", "3g", "4g", "7g", "1g.2x", "1g+me", "2g+me", "1g.5gb", "3g.71gb",
                     "2g.12gb"]).map(mig),
    st.builds(sized, st.integers(1, 7), st.floats(1, 150)),
)
PARAMS = st.builds(
    BalancerParams, threshold=st.sampled_from([0.0, 0.4, 0.6, 1.0]), lazy_first=st.booleans(),
    dynamic=st.booleans(), allow_larger=st.booleans(), top_k=st.integers(0, 3),
    rank=st.sampled_from(["absolute", "delta"]),
)
STEP = st.tuples(st.sampled_from(["place", "place", "place", "release", "destroy", "health"]), DEMANDS,
                 st.integers(0, 2**16))


def _apply(gpu: GpuView, plan: PartitionPlan, slot_profile: str, start: int, job: str) -> GpuView:
    model = GEO.model(gpu.model)
    destroyed = {op.instance_id for op in plan.ops if op.kind == "destroy_gi"}
    keep = [i for i in gpu.instances if i.id not in destroyed and i.id != plan.instance_id]
    prof = model.profile(slot_profile)
    inst = InstanceView(id=plan.instance_id, profile=prof.name, start=start, size=prof.memory_slices,
                        compute=prof.compute_slices, job_id=job)
    return gpu.with_instances([*keep, inst])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 10),
       models=st.lists(st.sampled_from(MODELS), min_size=1, max_size=3, unique=True),
       params=PARAMS, steps=st.lists(STEP, min_size=1, max_size=25), log_limit=st.sampled_from([2, 1 << 16]),
       signature_limit=st.sampled_from([0, 1 << 15]))
def test_the_index_places_exactly_as_the_balancer_through_a_sequence_of_changes(
    seed: int, n: int, models: list[str], params: BalancerParams, steps: list[tuple[str, Demand, int]],
    log_limit: int, signature_limit: int,
) -> None:
    gpus = list(random_cluster(random.Random(seed), n, tuple(models)).gpus)
    index = PlacementIndex(GEO, gpus, params)
    index.log_limit = log_limit  # 2: the change log is compacted all the time
    index.signature_limit = signature_limit  # 0: signatures are numbered afresh whenever twice the GPUs are known
    for k, (what, demand, pick) in enumerate(steps):
        if what == "place":
            job = JobRequest(job_id=f"j{k}", demand=demand)
            decision = place(snapshot_of(GEO, gpus), job, params)
            explained = index.decide(job)  # the mirror's answer, from the same keys
            slots = index.place(demand)
            if not isinstance(decision, Placement):
                assert slots is None and explained is None
                continue
            assert slots == decision.slots
            assert explained is None or explained == decision
            _apply_all(gpus, index, slots, f"j{k}")
        else:
            p = pick % len(gpus)
            gpus[p] = change_gpu(gpus[p], what, pick // len(gpus))
            index.update(gpus[p])
    assert index.agrees_with(gpus)  # what a full recomputation from the GPUs would key


def _apply_all(gpus: list[GpuView], index: PlacementIndex, slots: tuple[Slot, ...], job: str) -> None:
    for slot in slots:
        p = next(p for p, g in enumerate(gpus) if g.id == slot.gpu_id)
        plan = plan_partition(gpus[p], GEO.model(gpus[p].model), slot, job)
        assert isinstance(plan, PartitionPlan)
        gpus[p] = _apply(gpus[p], plan, slot.profile, slot.start, job)
        index.update(gpus[p])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 24), odd=st.sampled_from([0.0, 0.05]),
       steps=st.lists(st.tuples(st.sampled_from(["1", "2", "4", "1g", "release", "destroy", "health"]),
                                st.integers(0, 2**16)), min_size=1, max_size=25))
def test_whole_gpu_gangs_go_where_the_balancer_puts_them_while_every_gpu_is_in_mig_mode(
    seed: int, n: int, odd: float, steps: list[tuple[str, int]]
) -> None:
    gpus = list(random_cluster(random.Random(seed), n, ("A100-40GB", "H100-80GB"), odd_share=odd).gpus)
    index = PlacementIndex(GEO, gpus, BalancerParams())
    for k, (what, pick) in enumerate(steps):
        demand = gang_step(gpus, index, what, pick)
        if demand is None:
            continue
        decision = place(snapshot_of(GEO, gpus), JobRequest(job_id=f"j{k}", demand=demand))
        slots = index.place(demand)
        assert slots == (decision.slots if isinstance(decision, Placement) else None)
        if slots is not None:
            _apply_all(gpus, index, slots, f"j{k}")


def test_among_equal_gpus_the_index_picks_the_one_listed_first() -> None:
    gpus = [GpuView.build(id=f"g{i}", node="n", index=i, model="A100-40GB") for i in range(5)]
    index = PlacementIndex(GEO, gpus, BalancerParams(threshold=0.4))
    slots = index.place(mig("3g"))
    assert slots is not None and slots[0].gpu_id == "g0"


def test_a_gpu_changed_after_a_decision_is_rescored_before_the_next_one() -> None:
    gpus = [GpuView.build(id=f"g{i}", node="n", index=i, model="A100-40GB") for i in range(2)]
    index = PlacementIndex(GEO, gpus, BalancerParams(threshold=0.4))
    assert index.place(mig("7g")) is not None
    full = InstanceView(id="x", profile="7g.40gb", start=0, size=8, compute=7, job_id="j")
    gpus[0] = gpus[0].with_instances([full])
    index.update(gpus[0])
    slots = index.place(mig("7g"))
    assert slots is not None and slots[0].gpu_id == "g1"
    gpus[1] = gpus[1].with_instances([msgspec.structs.replace(full, id="y")])
    index.update(gpus[1])
    assert index.place(mig("7g")) is None


def test_the_change_log_stays_bounded_when_no_gang_is_ever_asked() -> None:
    gpus = [GpuView.build(id=f"g{i}", node="n", index=i, model="A100-40GB") for i in range(4)]
    index = PlacementIndex(GEO, gpus, BalancerParams())
    index.log_limit = 8
    busy = InstanceView(id="x", profile="1g.5gb", start=0, size=1, compute=1, job_id="j")
    for k in range(100):
        gpus[k % 4] = gpus[k % 4].with_instances([] if gpus[k % 4].instances else [busy])
        index.update(gpus[k % 4])
        if k % 10 == 0:
            index.place(mig("1g"))
    assert len(index._log) <= index.log_limit + 10  # at most the changes since the last read, past the limit
    assert index.empty_on("n") == sum(1 for g in gpus if not g.instances)  # rebuilt when first asked
