"""FGD: the vectorised rule against the plain loop (``tests/reference_fgd.py``) on random clusters and target
workloads, for MIG requests, gangs of whole GPUs and the nodes' fragmentation."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mig_strategies import clusters
from reference_fgd import choose, choose_gang, node_frag

from shared.policy.placement.decision import CannotPlace, JobRequest, Placement
from shared.policy.placement.plugins.fgd import Nodes, Target, fgd_rules
from shared.policy.request import Demand, mig
from shared.policy.snapshot import ClusterSnapshot

pytestmark = pytest.mark.unit

DEMANDS = st.sampled_from(["1g", "2g", "3g", "4g", "7g", "1g+me", "1g.10gb", "2g.20gb", "1g.2x"]).map(mig)
PODS = st.dictionaries(st.sampled_from(["1g", "1g.2x", "2g", "3g", "4g", "7g", "7gx2", "7gx4"]),
                       st.sampled_from([0.05, 0.1, 1 / 3, 0.5, 1.0]), min_size=1, max_size=6)
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(snap=clusters(), demand=DEMANDS, pods=PODS)
def test_the_vectorised_fgd_picks_what_the_plain_loop_picks(
    snap: ClusterSnapshot, demand: Demand, pods: dict[str, float]
) -> None:
    job = JobRequest(job_id="j", demand=demand)
    d = fgd_rules("fgd", pods).mig(snap, job)
    want = choose(snap, job, Target(pods))
    if want is None:
        assert isinstance(d, CannotPlace)
        assert sum(d.counts.values()) == len(snap)  # every GPU is accounted for in the reasons
        return
    assert isinstance(d, Placement)
    assert (d.slot.gpu_id, d.slot.start, d.slot.action) == want


@FAST
@given(snap=clusters(max_gpus=16), n=st.integers(1, 4), pods=PODS)
def test_an_fgd_gang_goes_to_the_gpus_the_plain_loop_picks(
    snap: ClusterSnapshot, n: int, pods: dict[str, float]
) -> None:
    gang = fgd_rules("fgd", pods).gang
    assert gang is not None
    d = gang(snap, JobRequest(job_id="j", demand=Demand(kind="gpus", gpus=n)))
    want = choose_gang(snap, n, Target(pods))
    if want is None:
        assert isinstance(d, CannotPlace) and d.reasons
        return
    assert isinstance(d, Placement)
    assert [s.gpu_id for s in d.slots] == want


@FAST
@given(snap=clusters(), pods=PODS)
def test_each_nodes_fragmentation_is_the_plain_count(snap: ClusterSnapshot, pods: dict[str, float]) -> None:
    target = Target(pods)
    nodes = Nodes(snap, target)
    want = node_frag(snap, target)
    names = {snap.gpus[p].node: int(i) for p, i in enumerate(nodes.node)}
    assert {name: int(nodes.frag[names[name]]) for name in want} == want


def test_popularities_are_fixed_point_so_equal_scores_tie_exactly() -> None:
    target = Target({"1g": 1 / 3, "3g": 2 / 3, "7g": 0.0})
    assert target.pods == (("1g", 1), ("3g", 1))  # a pod with no share is left out
    assert target.weights.tolist() == [round(Target.SCALE / 3), round(2 * Target.SCALE / 3)]
