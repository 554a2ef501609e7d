"""The baseline registry: every policy legal on random clusters, and each one's defining choice."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mig_strategies import GEO, clusters

from shared.mig.occupancy import span
from shared.policy.placement.decision import CannotPlace, JobRequest, Placement
from shared.policy.placement.registry import UnknownPolicyError, get_policy, policy_names
from shared.policy.request import Demand, mig, resolve_profile, sized
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of
from shared.policy.static_layouts import LayoutError, static_layout

pytestmark = pytest.mark.unit

DEMANDS = st.one_of(
    st.sampled_from(["1g", "2g", "3g", "4g", "7g", "1g.2x", "1g+me", "1g.5gb", "3g.71gb"]).map(mig),
    st.builds(sized, st.integers(1, 7), st.floats(1, 150)),
    st.builds(lambda n: Demand(kind="gpus", gpus=n), st.integers(1, 3)),
)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _assert_legal(snap: ClusterSnapshot, demand: Demand, d: Placement, repartitions: bool) -> None:
    for slot in d.slots:
        gpu = snap.gpu(slot.gpu_id)
        model = GEO.model(gpu.model)
        assert gpu.healthy
        if not gpu.mig:  # a whole plain GPU (the balancer's way for gpus: n)
            assert demand.kind == "gpus" and not gpu.busy_mask and not gpu.used_compute
            continue
        prof = model.profile(slot.profile)
        assert slot.start in prof.placements and slot.size == prof.memory_slices
        pm = span(prof.memory_slices, slot.start)
        assert not gpu.busy_mask & pm
        if slot.action == "reuse":
            inst = gpu.instance(slot.instance_id or "")
            assert inst is not None and not inst.busy
            assert (inst.profile, inst.start) == (slot.profile, slot.start)
        else:
            assert repartitions, "a static policy created an instance"
            assert set(slot.destroy) == {i.id for i in gpu.instances if not i.busy and i.mask & pm}
            others = sum(1 for i in gpu.instances if i.profile == prof.name and i.id not in slot.destroy)
            assert others < prof.max_count
    if demand.kind == "gpus":
        assert len(d.slots) == demand.gpus and len({s.gpu_id for s in d.slots}) == demand.gpus
        assert len({snap.gpu(s.gpu_id).node for s in d.slots}) == 1
        return
    (slot,) = d.slots
    model = GEO.model(snap.gpu(slot.gpu_id).model)
    prof, wanted = model.profile(slot.profile), resolve_profile(demand, model)
    assert wanted is not None
    assert prof.compute_slices >= wanted.compute_slices and prof.memory_slices >= wanted.memory_slices
    if repartitions:
        assert prof.name == wanted.name


@FAST
@given(snap=clusters(), demand=DEMANDS, name=st.sampled_from(policy_names()))
def test_every_baseline_returns_a_legal_placement_or_reasons(
    snap: ClusterSnapshot, demand: Demand, name: str
) -> None:
    spec, policy = get_policy(name)
    d = policy(snap, JobRequest(job_id="j", demand=demand))
    assert d.policy == name
    if isinstance(d, CannotPlace):
        assert d.reasons
    else:
        _assert_legal(snap, demand, d, spec.repartitions)


Spec = tuple[str, Sequence[tuple[str, int, str | None]]]


def _cluster(*gpus: Spec, per_node: int = 2) -> ClusterSnapshot:
    views = []
    for i, (model, insts) in enumerate(gpus):
        m = GEO.model(model)
        views.append(GpuView.build(id=f"g{i}", node=f"n{i // per_node}", index=i % per_node, model=model, instances=[
            InstanceView(id=f"g{i}/{p}@{s}", profile=p, start=s, size=m.profile(p).memory_slices,
                         compute=m.profile(p).compute_slices, job_id=j) for p, s, j in insts]))
    return snapshot_of(GEO, views)


def _place(name: str, snap: ClusterSnapshot, demand: Demand, **params: object) -> Placement:
    d = get_policy(name, **params)[1](snap, JobRequest(job_id="j", demand=demand))
    assert isinstance(d, Placement), d.explain()
    return d


HALF: Spec = ("A100-40GB", [("3g.20gb", 4, "a")])
QUARTER: Spec = ("A100-40GB", [("2g.10gb", 0, "b")])
FULL_BUT_ONE: Spec = ("A100-40GB", [("4g.20gb", 0, "c"), ("2g.10gb", 4, "d")])


def test_first_fit_takes_the_first_gpu_and_the_lowest_start() -> None:
    d = _place("first-fit", _cluster(HALF, QUARTER), mig("1g"))
    assert (d.slot.gpu_id, d.slot.start) == ("g0", 0)


def test_driver_default_takes_the_first_gpu_and_the_highest_start() -> None:
    d = _place("driver-default", _cluster(HALF, QUARTER), mig("1g"))
    assert (d.slot.gpu_id, d.slot.start) == ("g0", 3)


def test_best_fit_takes_the_fullest_gpu_that_fits() -> None:
    d = _place("best-fit", _cluster(QUARTER, HALF, FULL_BUT_ONE), mig("1g"))
    assert (d.slot.gpu_id, d.slot.start) == ("g2", 6)


def test_spread_takes_the_emptiest_gpu() -> None:
    d = _place("spread", _cluster(HALF, FULL_BUT_ONE, QUARTER), mig("1g"))
    assert d.slot.gpu_id == "g2"


def test_dynamic_baselines_reuse_an_idle_instance_of_the_exact_profile() -> None:
    snap = _cluster(("A100-40GB", [("1g.5gb", 5, None)]))
    for name in ("first-fit", "best-fit", "spread", "driver-default"):
        d = _place(name, snap, mig("1g"))
        assert d.slot.action == "reuse" and d.slot.start == 5, name
    # fgd ranks by its score first: reuse wins where it scores as well as the best new instance
    d = _place("fgd", _cluster(("A100-40GB", [("1g.5gb", 6, None)])), mig("1g"))
    assert d.slot.action == "reuse" and d.slot.start == 6


def test_dynamic_baselines_prefer_a_start_that_destroys_nothing() -> None:
    snap = _cluster(("A100-40GB", [("1g.5gb", 0, None)]))
    assert _place("first-fit", snap, mig("2g")).slot.start == 2
    assert not _place("first-fit", snap, mig("2g")).slot.destroy


def test_fgd_fills_the_hole_of_a_node_that_cannot_host_the_popular_whole_gpu_pod() -> None:
    # n0: g0 holds a 4g (its 3 free compute slices are fragment to a 7g pod); n1: g1 is empty. A 3g on g0
    # lowers n0's fragmentation by 1.5; on g1 it would raise n1's by 2 (g1 could no longer host a 7g)
    snap = _cluster(("A100-40GB", [("4g.20gb", 0, "a")]), ("A100-40GB", []), per_node=1)
    d = _place("fgd", snap, mig("3g"), pods={"3g": 0.5, "7g": 0.5})
    assert d.slot.gpu_id == "g0" and d.slot.start == 4


def test_fgd_counts_all_free_capacity_of_a_node_that_cannot_host_a_multi_gpu_pod() -> None:
    from shared.policy.placement.plugins.fgd import Nodes, Target

    snap = _cluster(("A100-40GB", [("1g.5gb", 0, "a")]), ("A100-40GB", []), per_node=2)
    # one empty GPU of two: the node cannot host a 2-GPU pod, so its 6 + 7 free compute slices are fragment
    assert Nodes(snap, Target({"7gx2": 1.0})).frag.tolist() == [13 * Target.SCALE]
    assert Nodes(snap, Target({"1g": 1.0})).frag.tolist() == [0]  # every GPU can host a 1g


def test_fgd_places_a_gang_on_the_node_whose_fragmentation_it_raises_least() -> None:
    # n0: three empty GPUs; n1: two. Against 2-GPU pods, two GPUs taken on n0 leave one that cannot host one,
    # its 7 free slices fragment (+7); taken on n1 they leave nothing free (+0)
    snap = _cluster(("A100-40GB", []), ("A100-40GB", []), ("A100-40GB", []),
                    ("A100-40GB", []), ("A100-40GB", []), per_node=3)
    d = get_policy("fgd", pods={"7gx2": 1.0})[1](snap, JobRequest(job_id="j", demand=Demand(kind="gpus", gpus=2)))
    assert isinstance(d, Placement) and {s.gpu_id for s in d.slots} == {"g3", "g4"}


def test_static_takes_the_smallest_idle_instance_that_covers_the_job_and_never_repartitions() -> None:
    layout = static_layout(GEO.model("A100-40GB"))
    snap = _cluster(("A100-40GB", [(p, s, None) for p, s in layout]))
    d = _place("static", snap, mig("1g"))
    assert d.slot.profile == "1g.5gb" and d.slot.action == "reuse"
    d = _place("static", snap, sized(2, 15))  # 2g.10gb is too small in memory: the 3g covers it
    assert d.slot.profile == "3g.20gb"
    assert isinstance(get_policy("static")[1](snap, JobRequest(job_id="j", demand=mig("7g"))), CannotPlace)


def test_static_accepts_whole_gpus_only_laid_out_as_one_full_instance() -> None:
    snap = _cluster(("A100-40GB", [("7g.40gb", 0, None)]), ("A100-40GB", [("7g.40gb", 0, None)]))
    d = _place("static", snap, Demand(kind="gpus", gpus=2))
    assert [s.action for s in d.slots] == ["reuse", "reuse"]
    snap = _cluster(("A100-40GB", []), ("A100-40GB", []))
    assert isinstance(get_policy("static")[1](snap, JobRequest(job_id="j", demand=Demand(kind="gpus"))),
                      CannotPlace)
    assert isinstance(_place("first-fit", snap, Demand(kind="gpus", gpus=2)), Placement)


def test_lb_static_balances_over_the_static_layout() -> None:
    a100 = GEO.model("A100-40GB")
    layout: list[tuple[str, int, str | None]] = [(p, s, None) for p, s in static_layout(a100)]
    busy = [(p, s, "x" if p == "3g.20gb" else None) for p, s, _ in layout]
    snap = _cluster(("A100-40GB", busy), ("A100-40GB", layout))
    d = _place("lb-static", snap, mig("1g"))
    assert d.slot.gpu_id == "g1" and d.slot.action == "reuse" and d.policy == "lb-static"
    spec = get_policy("lb-static", layout="all-1g")[0]
    assert spec.initial_layout == "all-1g" and not spec.repartitions and not spec.migrates


def test_the_registry_describes_each_policy() -> None:
    assert set(policy_names()) == {"migsched", "paper", "paper-nomig", "paper-pack", "first-fit", "best-fit",
                                   "spread", "driver-default", "fgd", "static", "lb-static"}
    assert get_policy("paper")[0].migrates and not get_policy("paper-nomig")[0].migrates
    assert get_policy("migsched")[0].reserves and not get_policy("first-fit")[0].reserves
    assert get_policy("static")[0].initial_layout == "all-balanced"
    assert get_policy("first-fit")[0].initial_layout is None
    assert get_policy("paper", threshold=0.5)[1] is not None


def test_an_unknown_policy_or_parameter_is_a_clear_error() -> None:
    with pytest.raises(UnknownPolicyError, match=r"known policies: migsched, .*lb-static"):
        get_policy("round-robin")
    with pytest.raises(UnknownPolicyError, match="takes no parameter"):
        get_policy("first-fit", threshold=0.3)


def test_an_unknown_or_impossible_layout_is_a_clear_error() -> None:
    with pytest.raises(LayoutError, match="unknown layout"):
        static_layout(GEO.model("A100-40GB"), "mostly-1g")
    with pytest.raises(LayoutError, match="has no profile"):
        static_layout(GEO.model("A30-24GB"), "all-3g")
    with pytest.raises(LayoutError, match="unknown layout"):
        get_policy("static", layout="half")
