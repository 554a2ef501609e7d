"""The event loop on tiny hand-checked scenarios: exact times, placements and reconfiguration counts."""

from __future__ import annotations

import math

import msgspec
import pytest

from shared.mig.geometry import default_geometry
from shared.policy.migration.planner import Move
from shared.policy.placement.balancer import place
from shared.policy.placement.registry import get_policy
from shared.policy.request import Demand
from shared.sim import events as ev
from shared.sim.cluster import parse_cluster
from shared.sim.config import InterferenceParams, SimConfig
from shared.sim.engine import Simulator
from shared.sim.jobs import SimJob, Workload

pytestmark = pytest.mark.unit

GEO = default_geometry()
NO_INTERFERENCE = InterferenceParams(beta=0.0)


class Spec(msgspec.Struct, frozen=True):
    name: str = "test"
    repartitions: bool = True
    initial_layout: str | None = None
    migrates: bool = False


def job(jid: str, at: float, dur: float, shape: str, **kw: object) -> SimJob:
    demand = Demand(kind="gpus", gpus=int(shape[:-3])) if shape.endswith("gpu") else Demand(profile=shape)
    return SimJob(
        id=jid, arrival=at, duration=dur, demand=demand, shape="7g" if shape.endswith("gpu") else shape, **kw
    )  # type: ignore[arg-type]


def sim(
    jobs: list[SimJob], gpus: str = "A100-40GB:1", spec: Spec | None = None, policy=place, **cfg: object
) -> Simulator:
    config = SimConfig(check_invariants=True, **{"interference": NO_INTERFERENCE, **cfg})  # type: ignore[arg-type]
    wl = Workload(name="t", jobs=tuple(sorted(jobs, key=lambda j: j.arrival)))
    return Simulator(wl, parse_cluster([gpus], GEO, 8), spec or Spec(), policy, config)


def where(s: Simulator, jid: str) -> list[tuple[str, str, int]]:
    out = []
    for iid in s.insts[s.index[jid]]:
        inst = s.cluster.instance(iid)
        assert inst is not None
        out.append((s.cluster.where[iid], inst.profile, inst.start))
    return out


def test_a_job_on_an_empty_gpu_starts_after_one_create_and_ends_after_its_duration() -> None:
    s = sim([job("a", 0.0, 100.0, "3g")])
    seen = {}
    s.hook = lambda sim_, e: seen.setdefault(e.kind, where(sim_, "a"))
    r = s.run()
    assert s.out.start[0] == pytest.approx(0.15) and s.out.finish[0] == pytest.approx(100.15)
    assert seen[ev.ARRIVAL] == [("node-0000/gpu0", "3g.20gb", 4)]  # the balancer keeps the low slices free
    assert (
        r.kpis.reconfigurations == 1 and r.kpis.completed == 1 and r.kpis.wait_mean_s == pytest.approx(0.15)
    )


def test_a_full_gpu_job_waits_for_both_exits_then_destroys_two_idle_instances_before_it_starts() -> None:
    s = sim([job("a", 0, 100, "3g"), job("b", 10, 100, "4g"), job("c", 20, 50, "7g")])
    r = s.run()
    assert s.out.start == pytest.approx(
        [0.15, 10.15, 110.60]
    )  # 2 destroys + 1 create = 0.45 s after b leaves
    assert s.out.finish == pytest.approx([100.15, 110.15, 160.60])
    assert r.kpis.reconfigurations == 5
    assert r.kpis.makespan_s == pytest.approx(160.60) and r.kpis.wait_mean_s == pytest.approx(
        (0.15 + 0.15 + 90.6) / 3
    )


def test_an_idle_instance_of_the_same_profile_is_reused_with_no_reconfiguration() -> None:
    s = sim([job("a", 0, 100, "2g"), job("b", 200, 50, "2g")])
    r = s.run()
    assert s.out.start[1] == 200.0 and s.out.finish[1] == 250.0
    assert r.kpis.reconfigurations == 1


def test_operations_on_one_gpu_run_one_after_the_other() -> None:
    s = sim([job("a", 0, 100, "1g"), job("b", 0, 100, "1g")])
    s.run()
    assert s.out.start == pytest.approx([0.15, 0.30])


def test_a_job_waiting_longer_than_its_patience_is_rejected_and_counted() -> None:
    s = sim([job("a", 0, 100, "7g"), job("b", 5, 10, "7g", patience=30.0)])
    r = s.run()
    assert s.out.finish[1] == 35.0 and not s.out.completed[1]
    assert r.kpis.rejected == 1 and r.kpis.rejection_rate == 0.5


def test_only_a_job_its_arrival_leaves_queued_gets_a_timeout_event() -> None:
    s = sim([job("a", 0, 100, "7g", patience=30.0), job("b", 5, 10, "7g", patience=30.0)])
    timeouts: list[list[tuple[int, float]]] = []

    def after_arrival(sim_: Simulator, e: ev.Event) -> None:
        if e.kind == ev.ARRIVAL:
            timeouts.append([(x.job, x.time) for x in sim_.q.heap if x.kind == ev.TIMEOUT])

    s.hook = after_arrival
    s.run()
    # a is placed by its own arrival's pass: no timeout of its own; b waits behind it and times out at 5 + 30
    assert timeouts == [[], [(1, 35.0)]]
    assert s.out.finish[1] == 35.0 and not s.out.completed[1] and s.out.completed[0]


def test_a_queued_job_backfills_when_an_exit_frees_room() -> None:
    s = sim([job("a", 0, 100, "4g"), job("b", 0, 100, "3g"), job("c", 1, 30, "3g")])
    s.run()
    # a (4g@0) leaves first at 100.15; c takes 3g@0 at once, destroying a's idle 4g first: 2 ops = 0.30 s
    assert s.out.start[2] == pytest.approx(100.45) and s.out.finish[2] == pytest.approx(130.45)
    assert where(s, "c") == [("node-0000/gpu0", "3g.20gb", 0)]


def test_higher_priority_jobs_are_placed_first_when_room_frees() -> None:
    jobs = [job("a", 0, 100, "7g"), job("low", 1, 10, "7g", priority=0), job("high", 2, 10, "7g", priority=5)]
    s = sim(jobs, reconfig_latency_s=0.0)
    s.run()
    assert s.out.start[2] == 100.0 and s.out.start[1] == 110.0


def test_a_multi_gpu_job_takes_whole_gpus_on_one_node_reconfigured_in_parallel() -> None:
    s = sim([job("g", 0, 60, "2gpu")], gpus="A100-40GB:2")
    seen: list[list[tuple[str, str, int]]] = []
    s.hook = lambda sim_, e: seen.append(where(sim_, "g")) if e.kind == ev.ARRIVAL else None
    s.run()
    assert sorted(seen[0]) == [("node-0000/gpu0", "7g.40gb", 0), ("node-0000/gpu1", "7g.40gb", 0)]
    assert s.out.start[0] == pytest.approx(0.15) and s.out.finish[0] == pytest.approx(60.15)


def test_co_runners_slow_each_other_down_by_their_class_intensity() -> None:
    params = InterferenceParams(beta=0.5, intensity={"small-training": 0.6})
    jobs = [job("a", 0, 100, "3g", wclass="small-training"), job("b", 0, 100, "4g", wclass="small-training")]
    s = sim(jobs, interference=params, reconfig_latency_s=0.0)
    s.run()
    # b is slowed by a's pressure 0.6*3/7, a by b's 0.6*4/7; after b leaves a runs alone at full speed
    t_b = 100 * (1 + 0.5 * 0.6 * 3 / 7)
    done_a = t_b / (1 + 0.5 * 0.6 * 4 / 7)
    assert s.out.finish[1] == pytest.approx(t_b, rel=1e-12)
    assert s.out.finish[0] == pytest.approx(t_b + 100 - done_a, rel=1e-12)


def test_a_move_reserves_the_destination_at_once_and_frees_the_source_when_it_completes() -> None:
    s = sim([job("a", 0, 1000, "1g")], spec=Spec(migrates=True), migration_downtime_s=2.0, checkpoint_s=0.0)
    during: list[tuple[str, ...]] = []

    def hook(sim_: Simulator, e: ev.Event) -> None:
        if e.kind == ev.RECONFIG_DONE:
            (src,) = sim_.insts[0]
            inst = sim_.cluster.instance(src)
            assert inst is not None
            dst_start = 0 if inst.start != 0 else 1
            move = Move(
                job_id="a",
                kind="intra",
                src_gpu=sim_.cluster.where[src],
                src_instance=src,
                src_profile=inst.profile,
                src_start=inst.start,
                dst_gpu=sim_.cluster.where[src],
                dst_profile=inst.profile,
                dst_start=dst_start,
                dst_size=1,
                destroy=(),
                frag_src_before=0,
                frag_src_after=0,
                frag_dst_before=0,
                frag_dst_after=0,
                expected_change=0,
                reason="test",
            )
            sim_._start_chain((move,))
            gpu = sim_.cluster.gpu(sim_.cluster.where[src])
            during.extend(i.job_id or "" for i in gpu.instances)
        if e.kind == ev.MIGRATION_DONE:
            assert sim_.cluster.instance(sim_.insts[0][0]).start in (0, 1)  # type: ignore[union-attr]

    s.hook = hook
    r = s.run()
    assert during == ["a", "a"]  # make-before-break: source and destination both held by the job
    # the move took one create (0.15 s) + 2 s downtime, and costs the job the 2 s it was stopped
    assert s.out.finish[0] == pytest.approx(0.15 + 1000 + 2.0)
    # create, the move's create, and at the exit the retention rule destroys the idle instance (no placement
    # in the last 300 s)
    assert r.kpis.migrations == 1 and r.kpis.migrated_share == 1.0 and r.kpis.reconfigurations == 3


def test_a_move_also_loses_the_progress_since_the_last_checkpoint() -> None:
    s = sim(
        [job("a", 0, 1000, "1g"), job("x", 100, 1, "1g")],
        spec=Spec(migrates=True),
        migration_downtime_s=0.0,
        checkpoint_s=60.0,
        reconfig_latency_s=0.0,
    )
    fired = []

    def hook(sim_: Simulator, e: ev.Event) -> None:
        if e.kind == ev.ARRIVAL and e.job == 1 and not fired:
            fired.append(1)
            (src,) = sim_.insts[0]
            inst = sim_.cluster.instance(src)
            assert inst is not None
            move = Move(
                job_id="a",
                kind="intra",
                src_gpu=sim_.cluster.where[src],
                src_instance=src,
                src_profile=inst.profile,
                src_start=inst.start,
                dst_gpu=sim_.cluster.where[src],
                dst_profile=inst.profile,
                dst_start=0 if inst.start else 1,
                dst_size=1,
                destroy=(),
                frag_src_before=0,
                frag_src_after=0,
                frag_dst_before=0,
                frag_dst_after=0,
                expected_change=0,
                reason="test",
            )
            sim_._start_chain((move,))

    s.hook = hook
    s.run()
    # moved at t=100 after 100 s of work: the last checkpoint was at 60 s, so 40 s are redone
    assert s.out.finish[0] == pytest.approx(1040.0)


def test_a_static_policy_never_reconfigures_and_takes_the_smallest_covering_instance() -> None:
    spec, policy = get_policy("static", layout="all-balanced")
    s = sim([job("a", 0, 10, "1g"), job("b", 0, 10, "2g")], spec=spec, policy=policy)  # type: ignore[arg-type]
    r = s.run()
    assert r.kpis.reconfigurations == 0 and s.out.start == [0.0, 0.0]
    assert where(s, "b")[0][1] == "2g.10gb"


def test_a_job_that_can_never_fit_is_rejected_once_nothing_else_can_happen() -> None:
    s = sim([job("g", 0, 10, "4gpu")], gpus="A100-40GB:2", patience_s=math.inf)
    r = s.run()
    assert r.kpis.rejected == 1 and r.kpis.completed == 0
