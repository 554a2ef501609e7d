"""Migration that unblocks a waiting one-node gang: the few jobs on one node's GPUs move away, all or none, and a
hold drains a node until only jobs that can be moved are left on it."""

from __future__ import annotations

import math

import pytest

from shared.mig.geometry import default_geometry
from shared.policy.migration.unblock import UnblockParams, free_after_moves, plan_clearing
from shared.policy.placement.decision import JobRequest
from shared.policy.placement.registry import get_policy
from shared.policy.request import Demand, mig
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of
from shared.sim.cluster import parse_cluster
from shared.sim.config import InterferenceParams, SimConfig
from shared.sim.engine import Simulator
from shared.sim.jobs import SimJob, Workload

pytestmark = pytest.mark.unit

GEO = default_geometry()
A100 = GEO.model("A100-40GB")
GANG = JobRequest(job_id="gang", demand=Demand(kind="gpus", gpus=2))


def _inst(gid: str, k: int, profile: str, start: int, ends: float = 1e6, job: str | None = None,
          **kw: object) -> InstanceView:
    p = A100.profile(profile)
    return InstanceView(id=f"{gid}/{k}", profile=p.name, start=start, size=p.memory_slices, compute=p.compute_slices,
                        job_id=job or f"{gid}/j{k}", ends_at=ends, **kw)  # type: ignore[arg-type]


def _gpu(gid: str, node: str, *insts: InstanceView) -> GpuView:
    return GpuView.build(id=gid, node=node, index=int(gid[1:]) % 2, model="A100-40GB", instances=insts)


def _snap(*gpus: GpuView) -> ClusterSnapshot:
    return snapshot_of(GEO, gpus)


def test_a_gang_gets_the_node_that_one_move_empties_and_the_job_goes_to_another_node() -> None:
    snap = _snap(
        _gpu("g0", "n0", _inst("g0", 0, "1g.5gb", 0)), _gpu("g1", "n0"),
        _gpu("g2", "n1", _inst("g2", 0, "4g.20gb", 0)),  # a 3g hole at 4
        _gpu("g3", "n1", _inst("g3", 0, "3g.20gb", 4), _inst("g3", 1, "1g.5gb", 0)),
    )
    got = plan_clearing(snap, GANG, now=0.0)
    assert got is not None and got.gpus == ("g0", "g1")
    assert [(m.job_id, m.src_gpu) for m in got.moves] == [("g0/j0", "g0")]
    assert got.moves[0].dst_gpu in {"g2", "g3"}  # a GPU with a job before an empty one


def test_a_whole_gpu_job_on_the_gangs_node_may_move_to_an_empty_gpu_of_another_node() -> None:
    snap = _snap(
        _gpu("g0", "n0", _inst("g0", 0, "7g.40gb", 0)), _gpu("g1", "n0"),
        _gpu("g2", "n1"), _gpu("g3", "n1", *[_inst("g3", k, "1g.5gb", k) for k in range(3)]),  # three: too many
    )
    got = plan_clearing(snap, GANG, now=0.0)
    assert got is not None and got.gpus == ("g0", "g1")
    assert [(m.job_id, m.dst_gpu) for m in got.moves] == [("g0/j0", "g2")]


def test_a_node_whose_gpus_hold_one_gangs_members_is_never_emptied_by_moving_them_one_by_one() -> None:
    def snap(first: str, second: str) -> ClusterSnapshot:
        return _snap(
            _gpu("g0", "n0", _inst("g0", 0, "7g.40gb", 0, job=first)),
            _gpu("g1", "n0", _inst("g1", 0, "7g.40gb", 0, job=second)),
            _gpu("g2", "n1"), _gpu("g3", "n1", *[_inst("g3", k, "1g.5gb", k) for k in range(3)]),
            _gpu("g4", "n2"), _gpu("g5", "n2", *[_inst("g5", k, "1g.5gb", k) for k in range(3)]),
        )

    assert plan_clearing(snap("x", "y"), GANG, now=0.0) is not None  # two jobs: two moves empty n0
    assert plan_clearing(snap("x", "x"), GANG, now=0.0) is None  # one gang's members


def test_no_moves_are_planned_for_a_gang_that_a_node_already_hosts_or_for_more_than_two_moves() -> None:
    fits = _snap(_gpu("g0", "n0"), _gpu("g1", "n0"), _gpu("g2", "n1", _inst("g2", 0, "4g.20gb", 0)), _gpu("g3", "n1"))
    assert plan_clearing(fits, GANG, now=0.0) is None
    crowded = _snap(
        _gpu("g0", "n0", _inst("g0", 0, "1g.5gb", 0), _inst("g0", 1, "1g.5gb", 1)),
        _gpu("g1", "n0", _inst("g1", 0, "1g.5gb", 0)),
        _gpu("g2", "n1", _inst("g2", 0, "4g.20gb", 0)), _gpu("g3", "n1", _inst("g3", 0, "4g.20gb", 0)),
    )
    assert plan_clearing(crowded, GANG, now=0.0) is None  # three moves for either node


def test_a_nodes_free_time_after_moves_leaves_out_its_two_last_jobs_when_both_may_move() -> None:
    now = 1000.0
    snap = _snap(
        _gpu("g0", "n0", _inst("g0", 0, "1g.5gb", 0, ends=2000.0)),
        _gpu("g1", "n0", _inst("g1", 0, "1g.5gb", 0, ends=9000.0), _inst("g1", 1, "1g.5gb", 1, ends=5000.0)),
        _gpu("g2", "n1", _inst("g2", 0, "1g.5gb", 0, ends=3000.0)),
        _gpu("g3", "n1", _inst("g3", 0, "1g.5gb", 0, ends=8000.0, latency_sensitive=True)),
    )
    free = free_after_moves(snap, now, UnblockParams(max_moves=2, min_left_s=300.0))
    # n0: the jobs ending at 9,000 and 5,000 move; g0 frees when its job ends
    # n1: its last job may not move, so nothing is left out there
    assert free.tolist() == [2000.0, now, 3000.0, 8000.0]


def _gang_wl() -> Workload:
    """Two 1g jobs that spread puts on both nodes (two GPUs each); then a 2-GPU gang with no node to go to."""
    jobs = [SimJob(id="a", arrival=0.0, duration=10000.0, demand=mig("1g"), shape="1g"),
            SimJob(id="b", arrival=1.0, duration=10000.0, demand=mig("1g"), shape="1g"),
            SimJob(id="c", arrival=1.5, duration=10000.0, demand=mig("1g"), shape="1g"),
            SimJob(id="d", arrival=1.7, duration=10000.0, demand=mig("1g"), shape="1g"),
            SimJob(id="gang", arrival=2.0, duration=100.0, demand=Demand(kind="gpus", gpus=2), shape="7g")]
    return Workload(name="t", jobs=tuple(jobs))


def test_in_the_simulator_a_blocked_gang_starts_once_a_node_is_emptied_by_moves() -> None:
    results = {}
    for unblock in (False, True):
        spec, pol = get_policy("spread", reserve=True, unblock=unblock)
        cfg = SimConfig(check_invariants=True, interference=InterferenceParams(beta=0.0), patience_s=600.0,
                        reserve_after_s=0.0)
        s = Simulator(_gang_wl(), parse_cluster(["A100-40GB:4"], GEO, 2), spec, pol, cfg)
        results[unblock] = (s.run().kpis, s)
    without, _ = results[False]
    assert without.classes["2gpu"].rejected == 1
    k, s = results[True]
    assert k.classes["2gpu"].rejected == 0 and 1 <= k.migrations <= 2
    gang = s.index["gang"]
    assert not math.isnan(s.out.start[gang]) and s.out.start[gang] < 2.0 + 600.0
