"""Migration that unblocks a waiting whole-GPU job: all moves or none, few of them, each job moved once, and
only when the waiting job then fits."""

from __future__ import annotations

import math

import pytest

from shared.mig.geometry import default_geometry
from shared.mig.occupancy import span
from shared.policy.migration.unblock import UnblockParams, plan_unblock
from shared.policy.placement.decision import JobRequest
from shared.policy.placement.registry import get_policy
from shared.policy.request import mig
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of
from shared.sim.cluster import parse_cluster
from shared.sim.config import InterferenceParams, SimConfig
from shared.sim.engine import Simulator
from shared.sim.jobs import SimJob, Workload

pytestmark = pytest.mark.unit

GEO = default_geometry()
A100 = GEO.model("A100-40GB")
JOB = JobRequest(job_id="big", demand=mig("7g"))


def _inst(gid: str, k: int, profile: str, start: int, ends: float = 1e6, **kw: object) -> InstanceView:
    p = A100.profile(profile)
    return InstanceView(id=f"{gid}/{k}", profile=p.name, start=start, size=p.memory_slices, compute=p.compute_slices,
                        job_id=f"{gid}/j{k}", ends_at=ends, **kw)  # type: ignore[arg-type]


def _gpu(gid: str, *insts: InstanceView) -> GpuView:
    return GpuView.build(id=gid, node="n0", index=int(gid[1:]), model="A100-40GB", instances=insts)


def _apply(snap: ClusterSnapshot, moves: tuple[object, ...]) -> dict[str, int]:
    """Busy masks after the moves (each source instance gone, each destination taken)."""
    masks = {g.id: g.busy_mask for g in snap.gpus}
    for m in moves:
        src = snap.gpu(m.src_gpu).instance(m.src_instance)  # type: ignore[attr-defined]
        assert src is not None
        masks[m.src_gpu] &= ~src.mask  # type: ignore[attr-defined]
        pm = span(m.dst_size, m.dst_start)  # type: ignore[attr-defined]
        assert not masks[m.dst_gpu] & pm  # type: ignore[attr-defined]  # never onto a busy slice
        masks[m.dst_gpu] |= pm  # type: ignore[attr-defined]
    return masks


def test_the_jobs_of_one_gpu_move_to_the_holes_of_others_and_free_it_whole() -> None:
    snap = snapshot_of(GEO, [
        _gpu("g0", _inst("g0", 0, "4g.20gb", 0)),                               # a 3g hole at 4
        _gpu("g1", _inst("g1", 0, "3g.20gb", 4)),                               # a 4g hole at 0
        _gpu("g2", _inst("g2", 0, "3g.20gb", 0), _inst("g2", 1, "1g.5gb", 4)),  # its 3g fits g0, its 1g g1
    ])
    moves = plan_unblock(snap, JOB, now=0.0)
    assert {m.job_id for m in moves} in ({"g2/j0", "g2/j1"}, {"g1/j0"}, {"g0/j0"})
    masks = _apply(snap, moves)
    assert any(v == 0 for v in masks.values())  # the waiting job then fits on the emptied GPU
    assert len(moves) <= 2 and len({m.job_id for m in moves}) == len(moves)


def test_nothing_moves_for_a_job_that_fits_on_less_than_a_whole_gpu() -> None:
    snap = snapshot_of(GEO, [_gpu("g0", _inst("g0", 0, "4g.20gb", 0)), _gpu("g1", _inst("g1", 0, "1g.5gb", 0))])
    assert plan_unblock(snap, JobRequest(job_id="j", demand=mig("3g")), now=0.0) == ()


@pytest.mark.parametrize("why", ["latency_sensitive", "moved_before", "ends_soon", "too_many", "no_room"])
def test_a_gpu_is_not_emptied_when_a_rule_forbids_it(why: str) -> None:
    kw: dict[str, object] = {}
    ends = 1e6
    if why == "latency_sensitive":
        kw["latency_sensitive"] = True
    elif why == "moved_before":
        kw["last_moved_at"] = -5.0
    elif why == "ends_soon":
        ends = 100.0
    src = [_inst("g1", 0, "1g.5gb", 0, ends, **kw)]
    if why == "too_many":
        src = [_inst("g1", k, "1g.5gb", k) for k in range(3)]
    room = [] if why == "no_room" else [_gpu("g0", _inst("g0", 0, "4g.20gb", 0))]
    snap = snapshot_of(GEO, [*room, _gpu("g1", *src)])
    assert plan_unblock(snap, JOB, now=0.0, params=UnblockParams(max_moves=2, min_left_s=300.0)) == ()


def _wl() -> Workload:
    """Two GPUs each holding one long 1g (one node); a 7g then waits with nowhere to go."""
    jobs = [SimJob(id="a", arrival=0.0, duration=10000.0, demand=mig("1g"), shape="1g"),
            SimJob(id="b", arrival=1.0, duration=10000.0, demand=mig("1g"), shape="1g"),
            SimJob(id="big", arrival=2.0, duration=100.0, demand=mig("7g"), shape="7g")]
    return Workload(name="t", jobs=tuple(jobs))


def test_in_the_simulator_a_blocked_whole_gpu_job_starts_after_one_move() -> None:
    results = {}
    for unblock in (False, True):
        spec, pol = get_policy("spread", reserve=True, unblock=unblock)  # spread puts a and b on both GPUs
        cfg = SimConfig(check_invariants=True, interference=InterferenceParams(beta=0.0), patience_s=600.0,
                        reserve_after_s=0.0)
        s = Simulator(_wl(), parse_cluster(["A100-40GB:2"], GEO, 2), spec, pol, cfg)
        k = s.run().kpis
        results[unblock] = (k, s)
    without, _ = results[False]
    assert without.classes["7g"].rejected == 1
    k, s = results[True]
    assert k.classes["7g"].rejected == 0 and k.migrations == 1 and k.migrated_share == pytest.approx(1 / 3)
    big = s.index["big"]
    assert s.out.start[big] < 2.0 + 600.0 and not math.isnan(s.out.start[big])
