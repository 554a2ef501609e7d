"""Gangs across nodes: all or nothing, on as few nodes as the free GPUs allow, the same rule for every policy,
held across nodes when they wait, and refused at once when no set of nodes could ever host them."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.mig.geometry import default_geometry
from shared.policy.gpu_view import InstanceView
from shared.policy.placement.decision import CannotPlace, JobRequest, Placement
from shared.policy.placement.gang import choose_nodes, gang_capacity, never_fits, spans_nodes
from shared.policy.placement.registry import get_policy, policy_names
from shared.policy.request import Demand, full_profile
from shared.policy.reservation import plan
from shared.policy.snapshot import ClusterSnapshot, GpuView, snapshot_of
from shared.sim.cluster import parse_cluster
from shared.sim.config import InterferenceParams, SimConfig
from shared.sim.engine import Simulator
from shared.sim.jobs import SimJob, Workload
from shared.sim.workloads.synthetic import GANG_CLASSES, synthetic
from tests.unit.mig_strategies import random_cluster

pytestmark = pytest.mark.unit

GEO = default_geometry()
POLICIES = policy_names()


def _fewest(free: list[int], n: int) -> int:
    """The fewest nodes whose free GPUs add up to ``n`` (brute force over the sorted counts)."""
    total = 0
    for k, f in enumerate(sorted(free, reverse=True), start=1):
        total += f
        if total >= n:
            return k
    return math.inf  # type: ignore[return-value]


@given(free=st.lists(st.integers(0, 8), min_size=1, max_size=12), n=st.integers(1, 60), data=st.data())
def test_the_node_choice_takes_exactly_n_gpus_on_the_fewest_nodes_that_hold_them(
        free: list[int], n: int, data: st.DataObject) -> None:
    whole = [f == 8 for f in free]
    prefer = data.draw(st.none() | st.lists(st.integers(0, 8), min_size=len(free), max_size=len(free)))
    chosen = choose_nodes(free, whole, n, prefer)
    if sum(free) < n:
        assert chosen is None
        return
    assert chosen is not None
    assert sum(t for _, t in chosen) == n
    assert len({j for j, _ in chosen}) == len(chosen) == _fewest(free, n)
    assert all(0 < t <= free[j] for j, t in chosen)


def test_whole_free_nodes_go_first_and_the_rest_takes_the_tightest_node() -> None:
    # nodes 0 and 1 have 4 free of 4 (node 1 whole) ... node 3 has exactly the 2 left over
    free, whole = [4, 4, 6, 2, 3], [False, True, False, True, False]
    assert choose_nodes(free, whole, 8) == [(2, 6), (3, 2)]
    assert choose_nodes([4, 4, 1], [False, True, True], 5) == [(1, 4), (2, 1)]


def test_between_nodes_alike_the_node_choice_takes_the_one_preferred_first() -> None:
    free, whole = [4, 4, 4, 2], [True, True, True, False]
    assert choose_nodes(free, whole, 6) == [(0, 4), (3, 2)]
    assert choose_nodes(free, whole, 6, prefer=[3, 0, 1, 0]) == [(1, 4), (3, 2)]
    assert choose_nodes(free, whole, 7, prefer=[3, 0, 1, 0]) == [(1, 4), (2, 3)]  # the rest: tightest, then preferred


def _empty_of(snap: ClusterSnapshot) -> Counter[str]:
    ok = np.asarray(snap.ok) & (np.asarray(snap.busy) == 0)
    return Counter(snap.gpus[p].node for p in np.flatnonzero(ok).tolist())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), nodes=st.integers(2, 8), n=st.integers(5, 32), name=st.sampled_from(POLICIES))
def test_every_policy_places_a_gang_bigger_than_a_node_all_or_nothing_on_the_fewest_nodes(
    seed: int, nodes: int, n: int, name: str
) -> None:
    rng = random.Random(seed)
    snap = random_cluster(rng, 4 * nodes, ("A100-40GB", "H100-80GB"), odd_share=0.0)
    assert spans_nodes(snap, Demand(kind="gpus", gpus=n))
    empty = _empty_of(snap)
    _, policy = get_policy(name)
    decision = policy(snap, JobRequest(job_id="gang", demand=Demand(kind="gpus", gpus=n)))
    if sum(empty.values()) < n:
        assert isinstance(decision, CannotPlace) and decision.reasons
        return
    assert isinstance(decision, Placement), decision
    gpus = [s.gpu_id for s in decision.slots]
    assert len(gpus) == len(set(gpus)) == n  # every member, each on its own GPU
    for s in decision.slots:
        g = snap.gpu(s.gpu_id)
        assert g.mig and g.healthy and g.busy_mask == 0
        assert s.profile == full_profile(GEO.model(g.model)).name
    used = Counter(snap.gpu(g).node for g in gpus)
    assert len(used) == _fewest(list(empty.values()), n)
    assert list(dict.fromkeys(s.node for s in decision.slots)) == list(used)  # rank order: node by node


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 4), name=st.sampled_from(POLICIES))
def test_a_gang_that_fits_on_one_node_stays_on_one_node(seed: int, n: int, name: str) -> None:
    snap = random_cluster(random.Random(seed), 16, ("A100-40GB",), odd_share=0.0)
    _, policy = get_policy(name)
    decision = policy(snap, JobRequest(job_id="gang", demand=Demand(kind="gpus", gpus=n)))
    if isinstance(decision, Placement):
        assert len({s.node for s in decision.slots}) == 1 and len(decision.slots) == n


def test_a_gang_of_plain_gpus_spans_nodes_too_and_never_mixes_them_with_mig_gpus() -> None:
    gpus = [GpuView.build(id=f"p{n}{i}", node=f"p{n}", index=i, model="A100-40GB", mig=False)
            for n in range(3) for i in range(2)]
    gpus += [GpuView.build(id=f"m{i}", node="m", index=i, model="A100-40GB") for i in range(2)]
    snap = snapshot_of(GEO, gpus)
    _, policy = get_policy("migsched")
    d = policy(snap, JobRequest(job_id="g", demand=Demand(kind="gpus", gpus=5)))
    assert isinstance(d, Placement)
    assert {s.profile for s in d.slots} == {"gpu"} and len({s.node for s in d.slots}) == 3


def _mixed_nodes(busy_mig: bool = True) -> ClusterSnapshot:
    """Two nodes of eight GPUs, four not in MIG mode and four in MIG mode (running a small job when
    ``busy_mig``)."""
    gpus = []
    for n in range(2):
        gpus += [GpuView.build(id=f"n{n}/{i}", node=f"n{n}", index=i, model="A100-40GB", mig=False) for i in range(4)]
        gpus += [GpuView.build(id=f"n{n}/{i}", node=f"n{n}", index=i, model="A100-40GB",
                               instances=[InstanceView(id=f"n{n}/{i}:1g", profile="1g.5gb", start=0, size=1,
                                                       compute=1, job_id=f"small{n}{i}")] if busy_mig else [])
                 for i in range(4, 8)]
    return snapshot_of(GEO, gpus)


@pytest.mark.parametrize("name", POLICIES)
def test_a_gang_more_than_any_node_has_of_one_kind_spans_nodes_even_when_a_node_has_as_many_gpus(name: str) -> None:
    snap = _mixed_nodes()
    six = Demand(kind="gpus", gpus=6)  # each node holds 8 GPUs, but only 4 of a kind, and a gang never mixes them
    assert spans_nodes(snap, six) and not spans_nodes(snap, Demand(kind="gpus", gpus=4))
    _, policy = get_policy(name)
    d = policy(snap, JobRequest(job_id="g", demand=six))
    assert isinstance(d, Placement), d
    assert {s.profile for s in d.slots} == {"gpu"} and len(d.slots) == 6 and len({s.node for s in d.slots}) == 2


def test_a_gang_more_than_the_cluster_has_of_one_kind_never_fits_and_says_so() -> None:
    snap = _mixed_nodes()
    assert gang_capacity(snap) == 8
    assert never_fits(Demand(kind="gpus", gpus=8), len(snap), gang_capacity(snap)) is None
    assert never_fits(Demand(kind="gpus", gpus=12), len(snap), gang_capacity(snap)) == (
        "needs 12 GPUs of one kind; the cluster has 16, at most 8 of one kind (a gang never mixes GPUs in MIG mode "
        "with others)")


def test_a_waiting_gang_more_than_any_node_has_of_one_kind_is_held_across_nodes() -> None:
    snap = _mixed_nodes(busy_mig=False)
    free = np.where(np.asarray(snap.mig, dtype=bool), 9000.0, 100.0)  # the plain GPUs free first
    r = plan(snap, "gang", 6, now=0.0, deadline=3600.0, free_at=free, plain=True)
    assert r is not None and r.start == 100.0 and set(r.nodes) == {"n0", "n1"}
    assert all(not snap.gpus[snap.position[g]].mig for g in r.gpus)


def _nodes(n_nodes: int, per_node: int) -> ClusterSnapshot:
    return snapshot_of(GEO, [GpuView.build(id=f"g{n}-{i}", node=f"n{n}", index=i, model="A100-40GB")
                                    for n in range(n_nodes) for i in range(per_node)])


def test_a_waiting_gang_bigger_than_a_node_holds_the_gpus_that_free_soonest_across_nodes() -> None:
    snap = _nodes(4, 2)
    free = np.array([0.0, 500.0, 100.0, 100.0, 50.0, 9000.0, 200.0, 300.0])
    r = plan(snap, "gang", 5, now=0.0, deadline=3600.0, free_at=free)
    assert r is not None
    assert sorted(r.gpus) == ["g0-0", "g1-0", "g1-1", "g2-0", "g3-0"]  # the five earliest (0, 50, 100, 100, 200)
    assert r.start == 200.0 and set(r.nodes) == {"n0", "n1", "n2", "n3"} and r.node == r.nodes[0]
    assert plan(snap, "gang", 5, now=0.0, deadline=150.0, free_at=free) is None  # not free before it gives up
    held = plan(snap, "gang", 4, now=0.0, deadline=3600.0, free_at=free, taken={"g0-0"})
    assert held is not None and "g0-0" not in held.gpus and len(held.gpus) == 4


def test_a_gang_no_set_of_nodes_could_host_is_rejected_on_arrival_with_the_reason() -> None:
    jobs = (SimJob(id="huge", arrival=5.0, duration=60.0, demand=Demand(kind="gpus", gpus=32), shape="7g"),
            SimJob(id="fits", arrival=6.0, duration=60.0, demand=Demand(kind="gpus", gpus=12), shape="7g"))
    assert never_fits(jobs[0].demand, 16) == "needs 32 GPUs; the cluster has 16"
    spec, policy = get_policy("migsched")
    cfg = SimConfig(interference=InterferenceParams(beta=0.0), patience_s=math.inf, check_invariants=True)
    k = Simulator(Workload(name="w", jobs=jobs), parse_cluster(["A100-40GB:16"], GEO, 8), spec, policy, cfg).run().kpis
    assert k.rejected == 1 and k.completed == 1
    assert k.refused == {"needs 32 GPUs; the cluster has 16": 1}
    assert k.classes["12gpu"].rejected == 0


@pytest.mark.parametrize("name", ["migsched", "first-fit", "fgd"])
def test_with_unlimited_patience_every_gang_runs_when_the_cluster_holds_the_biggest(name: str) -> None:
    wl = synthetic(np.random.default_rng(3), jobs=400, load=1.0, cluster_slices=128 * 7, classes=GANG_CLASSES)
    assert max(j.gpus for j in wl.jobs) == 128
    spec, policy = get_policy(name)
    cfg = SimConfig(interference=InterferenceParams(beta=0.0), patience_s=math.inf, check_invariants=True)
    k = Simulator(wl, parse_cluster(["A100-40GB:128"], GEO, 8), spec, policy, cfg).run().kpis
    gangs = {c: v for c, v in k.classes.items() if c.endswith("gpu")}
    assert any(int(c[:-3]) > 8 for c in gangs)
    assert all(v.rejected == 0 for v in gangs.values()), gangs  # only interactive jobs have a patience of their own
    assert k.refused == {}


@pytest.mark.parametrize("name", ["migsched", "paper", "best-fit"])
def test_a_gang_without_a_node_of_empty_mig_gpus_says_so_and_nothing_of_plain_gpus_there_are_none_of(
        name: str) -> None:
    busy = InstanceView(id="i", profile="1g.5gb", start=0, size=1, compute=1, job_id="j")
    gpus = [GpuView.build(id="a0", node="a", index=0, model="A100-40GB"),
            GpuView.build(id="a1", node="a", index=1, model="A100-40GB", instances=[busy])]
    _, policy = get_policy(name)
    d = policy(snapshot_of(GEO, gpus), JobRequest(job_id="w", demand=Demand(kind="gpus", gpus=2)))
    assert isinstance(d, CannotPlace)
    assert d.reasons == ("no node has 2 empty GPU(s) in MIG mode; the most on one node is 1",)
