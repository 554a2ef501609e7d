"""Reservations: the pure rule (which GPUs, until when, who may use them) and the simulator's queue pass that
holds GPUs for a waiting large job so that smaller jobs cannot starve it."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest

from shared.mig.geometry import default_geometry
from shared.policy import hold_pass
from shared.policy.placement.decision import CannotPlace
from shared.policy.placement.registry import get_policy
from shared.policy.request import Demand, mig
from shared.policy.reservation import expected_run, may_use, plan, whole_gpus
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of
from shared.sim import reserving
from shared.sim.cluster import parse_cluster
from shared.sim.config import InterferenceParams, SimConfig
from shared.sim.engine import Simulator
from shared.sim.jobs import SimJob, Workload
from shared.sim.workloads.synthetic import GANG_CLASSES, synthetic

pytestmark = pytest.mark.unit

GEO = default_geometry()


def _snap(nodes: int, per_node: int) -> ClusterSnapshot:
    return snapshot_of(GEO, [GpuView.build(id=f"g{n}{i}", node=f"n{n}", index=i, model="A100-40GB")
                                    for n in range(nodes) for i in range(per_node)])


def _free(snap: ClusterSnapshot, at: dict[str, float]) -> np.ndarray:
    return np.array([at.get(g.id, 0.0) for g in snap.gpus])


def test_a_reservation_takes_the_node_whose_needed_gpus_free_soonest() -> None:
    snap = _snap(2, 2)
    free_at = _free(snap, {"g00": 100.0, "g01": 900.0, "g10": 300.0, "g11": 400.0})
    r = plan(snap, "big", 2, now=0.0, deadline=1000.0, free_at=free_at)
    assert r is not None and r.node == "n1" and set(r.gpus) == {"g10", "g11"} and r.start == 400.0
    one = plan(snap, "one", 1, now=0.0, deadline=1000.0, free_at=free_at)
    assert one is not None and one.gpus == ("g00",) and one.start == 100.0


def test_nodes_whose_gpus_free_alike_tie_and_the_hold_goes_to_the_first_in_snapshot_order() -> None:
    # n1 and n2 free at the same times; summed as differences of one running sum, the idle GPU-seconds of the
    # two differed in their last bits and the hold went to n2
    snap = _snap(3, 2)
    free_at = np.array([3527.5, 2461.7, 749.9, 804.1, 749.9, 804.1])
    r = plan(snap, "big", 2, now=0.0, deadline=1e9, free_at=free_at)
    assert r is not None and r.node == "n1" and r.gpus == ("g10", "g11")


def test_the_expected_free_times_come_from_the_running_jobs_ends() -> None:
    from shared.policy.snapshot import InstanceView

    gpus = [GpuView.build(id=f"g{i}", node="n0", index=i, model="A100-40GB", instances=[InstanceView(
        id=f"i{i}", profile="1g.5gb", start=0, size=1, compute=1, job_id=f"j{i}", ends_at=e)])
        for i, e in enumerate((500.0, 200.0))]
    gpus.append(GpuView.build(id="g2", node="n0", index=2, model="A100-40GB"))
    r = plan(snapshot_of(GEO, gpus), "big", 2, now=100.0, deadline=1000.0)
    assert r is not None and r.gpus == ("g2", "g1") and r.start == 200.0


def _running(gid: str, node: str, index: int, profile: str, ends_at: float) -> GpuView:
    size = 8 if profile.startswith("7g") else int(profile[0])
    return GpuView.build(id=gid, node=node, index=index, model="A100-40GB", instances=[InstanceView(
        id=f"i-{gid}", profile=profile, start=0, size=size, compute=int(profile[0]), job_id=f"j-{gid}",
        ends_at=ends_at)])


def _small_and_whole() -> ClusterSnapshot:
    """One node: a GPU running a 1g job (ends at 100) and one running a 7g job (ends at 500)."""
    return snapshot_of(GEO, [_running("small", "n0", 0, "1g.5gb", 100.0), _running("whole", "n0", 1, "7g.40gb", 500.0)])


def test_a_hold_leaves_the_gpus_small_jobs_share_when_a_whole_gpu_frees_in_time() -> None:
    snap = _small_and_whole()
    r = plan(snap, "7g-job", 1, now=0.0, deadline=1000.0)
    assert r is not None and r.gpus == ("whole",) and r.start == 500.0 and r.reason == "expected free in 500 s"
    # a GPU running a 4g and a 3g is as full as one running a 7g, yet small jobs share it
    pair = GpuView.build(id="pair", node="n1", index=0, model="A100-40GB", instances=[
        InstanceView(id="a", profile="4g.20gb", start=0, size=4, compute=4, job_id="a", ends_at=50.0),
        InstanceView(id="b", profile="3g.20gb", start=4, size=4, compute=3, job_id="b", ends_at=60.0)])
    snap2 = snapshot_of(GEO, [pair, _running("whole", "n1", 1, "7g.40gb", 500.0)])
    r2 = plan(snap2, "7g-job", 1, now=0.0, deadline=1000.0)
    assert r2 is not None and r2.gpus == ("whole",)


def test_no_hold_drains_a_shared_gpu_while_a_whole_gpu_would_free_for_the_job_later() -> None:
    snap = _small_and_whole()
    assert plan(snap, "7g-job", 1, now=0.0, deadline=300.0) is None  # "whole" frees, but after the deadline


def test_a_hold_takes_a_shared_gpu_only_when_no_other_gpu_would_ever_free_for_the_job() -> None:
    no_hint = _running("whole", "n0", 1, "7g.40gb", 500.0)
    no_hint = GpuView.build(id="whole", node="n0", index=1, model="A100-40GB",
                            instances=[msgspec.structs.replace(no_hint.instances[0], ends_at=None)])
    snap = snapshot_of(GEO, [_running("small", "n0", 0, "1g.5gb", 100.0), no_hint])
    r = plan(snap, "7g-job", 1, now=0.0, deadline=300.0)
    assert r is not None and r.gpus == ("small",) and r.start == 100.0
    assert r.reason == "expected free in 100 s; holds GPUs small jobs share: no others ever free"
    snap2 = _small_and_whole()
    both = plan(snap2, "2-gpus", 2, now=0.0, deadline=1000.0)  # needs both GPUs of the node
    assert both is not None and set(both.gpus) == {"small", "whole"} and both.start == 500.0


def test_a_gang_across_nodes_holds_the_gpus_small_jobs_share_last() -> None:
    gpus = [_running(f"s{n}", f"n{n}", 0, "2g.10gb", 10.0) for n in range(3)]
    gpus += [_running(f"w{n}{i}", f"n{n}", i, "7g.40gb", 100.0 * (n + 1)) for n in range(3) for i in (1, 2)]
    snap = snapshot_of(GEO, gpus)
    r = plan(snap, "gang", 4, now=0.0, deadline=1000.0)
    assert r is not None and set(r.gpus) == {"w01", "w02", "w11", "w12"} and r.start == 200.0
    assert plan(snap, "gang", 7, now=0.0, deadline=1000.0) is not None  # six whole GPUs are not enough


def _empty(gid: str, node: str, index: int) -> GpuView:
    return GpuView.build(id=gid, node=node, index=index, model="A100-40GB")


def test_a_gang_across_nodes_holds_a_node_busy_until_its_start_before_one_free_now() -> None:
    # 6 GPUs on nodes of 4: the 6th frees at 100, when n0 (free now) and n1 (busy until then) are ready alike
    gpus = [_empty(f"e0{i}", "n0", i) for i in range(4)]
    gpus += [_running(f"b1{i}", "n1", i, "7g.40gb", 100.0) for i in range(4)]
    gpus += [_empty("e20", "n2", 0)] + [_running(f"b2{i}", "n2", i, "7g.40gb", 300.0) for i in (1, 2, 3)]
    r = plan(snapshot_of(GEO, gpus), "gang", 6, now=0.0, deadline=1000.0)
    assert r is not None and r.start == 100.0
    assert {g for g in r.gpus if g.startswith("b1")} == {"b10", "b11", "b12", "b13"}
    assert len([g for g in r.gpus if g.startswith("e0")]) == 2  # the rest on n0, two of its GPUs left open
    assert r.nodes == ("n1", "n0")


def test_on_a_node_a_gang_holds_the_gpus_busy_until_its_start_before_those_free_now() -> None:
    gpus = [_running(f"b0{i}", "n0", i, "7g.40gb", 100.0) for i in range(4)]
    gpus += [_empty(f"e1{i}", "n1", i) for i in (0, 1)] + [_running(f"b1{i}", "n1", i, "7g.40gb", 50.0) for i in (2, 3)]
    gpus += [_running(f"b2{i}", "n2", i, "7g.40gb", 1000.0) for i in range(4)]
    r = plan(snapshot_of(GEO, gpus), "gang", 6, now=0.0, deadline=2000.0)
    assert r is not None and r.start == 100.0
    assert set(r.gpus) == {"b00", "b01", "b02", "b03", "b12", "b13"}  # e10 and e11 stay open to jobs that fit now


def _plain(gid: str, node: str, index: int, ends_at: float | None) -> GpuView:
    """A GPU not in MIG mode, running a whole-GPU job until ``ends_at`` (None: free)."""
    insts = [] if ends_at is None else [InstanceView(id=f"i-{gid}", profile="gpu", start=0, size=8, compute=7,
                                                     job_id=f"j-{gid}", ends_at=ends_at)]
    return GpuView.build(id=gid, node=node, index=index, model="A100-40GB", mig=False, instances=insts)


def test_a_gpus_job_is_held_on_gpus_not_in_mig_mode_of_one_kind_the_earlier_start_winning() -> None:
    plain = [_plain(f"p{n}{i}", f"p{n}", i, 100.0 * (n + 1) if i else None) for n in range(2) for i in range(2)]
    snap = snapshot_of(GEO, plain)
    assert plan(snap, "gang", 4, now=0.0, deadline=1000.0) is None  # a MIG request's hold: no MIG GPU here
    r = plan(snap, "gang", 4, now=0.0, deadline=1000.0, plain=True)
    assert r is not None and set(r.gpus) == {g.id for g in plain} and r.start == 200.0 and r.nodes == ("p0", "p1")
    # beside MIG GPUs that free sooner, the hold is on them, never on a mix of the two kinds
    def with_mig(ends: float) -> ClusterSnapshot:
        return snapshot_of(GEO, [*plain, *(_running(f"m{n}{i}", f"m{n}", i, "7g.40gb", ends)
                                           for n in range(2) for i in range(2))])

    m = plan(with_mig(50.0), "gang", 4, now=0.0, deadline=1000.0, plain=True)
    assert m is not None and set(m.gpus) == {"m00", "m01", "m10", "m11"} and m.start == 50.0
    # freeing at the same time, the plain GPUs win: placement tries them first
    t = plan(with_mig(200.0), "gang", 4, now=0.0, deadline=1000.0, plain=True)
    assert t is not None and set(t.gpus) == {g.id for g in plain}


def test_a_hold_on_gpus_not_in_mig_mode_leaves_out_a_time_sliced_gpu_while_whole_ones_would_free() -> None:
    share = GpuView.build(id="p00", node="p0", index=0, model="A100-40GB", mig=False, replicas=4, instances=[
        InstanceView(id="s", profile="shared", start=0, size=0, compute=0, job_id="nb", ends_at=50.0)])
    snap = snapshot_of(GEO, [share, _plain("p01", "p0", 1, 100.0), _plain("p10", "p1", 0, 200.0),
                             _plain("p11", "p1", 1, 250.0)])
    two = plan(snap, "pair", 2, now=0.0, deadline=1000.0, plain=True)
    assert two is not None and set(two.gpus) == {"p10", "p11"} and two.start == 250.0  # p0 drains its shares
    one = plan(snap, "one", 1, now=0.0, deadline=1000.0, plain=True)
    assert one is not None and one.gpus == ("p01",) and one.start == 100.0
    # p1 would free only after the job gives up: it gets no hold, rather than one draining the shares' GPU
    assert plan(snap, "pair", 2, now=0.0, deadline=120.0, plain=True) is None


def test_no_reservation_when_the_gpus_would_not_free_before_the_job_gives_up() -> None:
    snap = _snap(1, 2)
    assert plan(snap, "big", 2, now=0.0, deadline=3600.0, free_at=_free(snap, {"g00": 50.0, "g01": 5000.0})) is None
    never = _free(snap, {"g00": 50.0, "g01": math.inf})
    assert plan(snap, "big", 2, now=0.0, deadline=math.inf, free_at=never) is None
    assert plan(snap, "big", 3, now=0.0, deadline=3600.0) is None  # no node has 3 GPUs


def test_gpus_held_by_an_earlier_reservation_are_left_out() -> None:
    snap = _snap(2, 1)
    r = plan(snap, "b", 1, now=0.0, deadline=100.0, taken={"g00"}, free_at=_free(snap, {"g00": 10.0, "g10": 20.0}))
    assert r is not None and r.gpus == ("g10",)


def test_only_a_job_whose_hint_ends_before_the_hold_may_use_held_gpus() -> None:
    assert may_use(100.0, now=0.0, held_until=100.0)
    assert not may_use(101.0, now=0.0, held_until=100.0)
    assert not may_use(None, now=0.0, held_until=1e9)  # no hint, no way in
    assert may_use(150.0, now=0.0, held_until=100.0, slack_s=50.0)  # relaxed: up to the slack past the start
    assert not may_use(151.0, now=0.0, held_until=100.0, slack_s=50.0)
    assert not may_use(None, now=0.0, held_until=100.0, slack_s=1e9)


def test_a_hold_says_when_its_gpus_free_from_the_time_it_is_read() -> None:
    from shared.policy.reservation import Reservation

    r = Reservation(job_id="g", gpus=("a/0", "b/0"), node="a", nodes=("a", "b"), start=1_000_060.0,
                    reason="expected free in 60 s; holds GPUs small jobs share: no others ever free")
    assert r.explain() == f"g: 2 GPU(s) on a, b held until ~1000060 ({r.reason})"  # the clock of the plan
    assert r.explain(1_000_020.0) == ("g: 2 GPU(s) on a, b held, expected free in 40 s "
                                      "(holds GPUs small jobs share: no others ever free)")
    free = msgspec.structs.replace(r, reason="free now", start=1_000_000.0)
    assert free.explain(1_000_100.0) == "g: 2 GPU(s) on a, b held, free now"


def test_large_means_whole_gpus() -> None:
    snap = _snap(1, 1)
    assert whole_gpus(snap.model_list, Demand(kind="gpus", gpus=4)) == 4
    assert whole_gpus(snap.model_list, mig("7g")) == 1
    assert whole_gpus(snap.model_list, mig("4g")) == 0
    assert whole_gpus(snap.model_list, Demand(kind="shared")) == 0


def _job(jid: str, at: float, dur: float, demand: Demand, shape: str, patience: float | None = None) -> SimJob:
    return SimJob(id=jid, arrival=at, duration=dur, demand=demand, shape=shape, patience=patience)


def _starving() -> Workload:
    """Two nodes of two GPUs; a 1g every 100 s for 1,000 s each keeps every GPU busy under ``spread``; a
    2-GPU job arrives at t=350, when every GPU holds one, and waits at most 3,000 s."""
    jobs = [_job(f"s{k:03d}", 100.0 * k, 1000.0, mig("1g"), "1g") for k in range(80)]
    jobs.append(_job("gang", 350.0, 500.0, Demand(kind="gpus", gpus=2), "7g", patience=3000.0))
    return Workload(name="starving", jobs=tuple(sorted(jobs, key=lambda j: (j.arrival, j.id))))


def _run(policy: str, reserve: bool, wl: Workload) -> Simulator:
    spec, pol = get_policy(policy, reserve=reserve)
    cfg = SimConfig(check_invariants=True, interference=InterferenceParams(beta=0.0))
    s = Simulator(wl, parse_cluster(["A100-40GB:4"], GEO, 2), spec, pol, cfg)
    s.run()
    return s


def test_a_gang_that_small_jobs_starve_starts_once_its_gpus_are_held() -> None:
    wl = _starving()
    gang = next(i for i, j in enumerate(wl.jobs) if j.id == "gang")
    without = _run("spread", False, wl)
    assert not without.out.completed[gang]  # small jobs keep taking the room a whole node would need
    held = _run("spread", True, wl)
    assert held.out.completed[gang]
    assert held.out.start[gang] - wl.jobs[gang].arrival <= 3000.0
    assert held.rec.result(0.0).kpis.reserved_idle_gpu_h > 0  # the node drained: held slices stood idle


def test_no_job_that_would_delay_a_reservation_ever_starts_on_its_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[reserving.Reservation] = []
    original_plan, original_schedule = reserving.plan, reserving.schedule

    def recording_plan(*a: object, **kw: object) -> reserving.Reservation | None:
        r = original_plan(*a, **kw)  # type: ignore[arg-type]
        if r is not None:
            made.append(r)
        return r

    def pass_(sim: Simulator) -> None:
        made.clear()
        original_schedule(sim)

    monkeypatch.setattr(hold_pass, "plan", recording_plan)  # a queue pass's holds
    monkeypatch.setattr(reserving, "plan", recording_plan)  # a hold that moves would drain sooner
    monkeypatch.setattr(reserving, "schedule", pass_)
    checked = [0]

    class Checked(Simulator):
        def start(self, i: int, slots: tuple[object, ...]) -> None:  # type: ignore[override]
            hint = self.hint(i)
            for r in made:
                if r.job_id == self.jobs[i].id:
                    continue
                for slot in slots:
                    if slot.gpu_id in r.gpus:  # type: ignore[attr-defined]
                        checked[0] += 1
                        assert hint is not None and self.now + hint <= r.start, (self.jobs[i].id, r)
            super().start(i, slots)  # type: ignore[arg-type]

    runs = [(_backfill(), "A100-40GB:2", 2)]
    runs += [(synthetic(np.random.default_rng(seed), jobs=300, load=1.3, cluster_slices=8 * 7), "A100-40GB:8", 4)
             for seed in range(2)]
    # gangs bigger than a node, held across nodes
    runs += [(synthetic(np.random.default_rng(7), jobs=300, load=1.3, cluster_slices=32 * 7, classes=GANG_CLASSES),
              "A100-40GB:32", 4)]
    for wl, gpus, per_node in runs:
        for name in ("migsched", "first-fit"):
            spec, pol = get_policy(name, reserve=True)
            cfg = SimConfig(interference=InterferenceParams(beta=0.0), patience_s=1800.0, check_invariants=True,
                            reserve_after_s=0.0)
            s = Checked(wl, parse_cluster([gpus], GEO, per_node), spec, pol, cfg)
            k = s.run().kpis
            assert k.completed + k.rejected == k.jobs
    assert checked[0] > 0  # the short job of _backfill did use a held GPU, and was checked


def _backfill() -> Workload:
    """One node of two GPUs, both busy (ends 1,000 and 500); a 2-GPU gang waits; a 7g ending before the gang
    can start, and one that would end long after, wait behind it."""
    return Workload(name="backfill", jobs=(
        _job("a", 0.0, 1000.0, mig("7g"), "7g"), _job("b", 0.0, 500.0, mig("7g"), "7g"),
        _job("gang", 10.0, 500.0, Demand(kind="gpus", gpus=2), "7g"),
        _job("short", 20.0, 300.0, mig("7g"), "7g"), _job("long", 30.0, 5000.0, mig("7g"), "7g"),
    ))


def test_a_short_job_backfills_onto_held_gpus_and_a_long_one_waits_behind_the_gang() -> None:
    wl = _backfill()
    starts = {}
    for reserve, after in ((True, 0.0), (False, 0.0), (True, 1200.0)):
        spec, pol = get_policy("first-fit", reserve=reserve)
        cfg = SimConfig(interference=InterferenceParams(beta=0.0), check_invariants=True, reconfig_latency_s=0.0,
                        reserve_after_s=after)
        s = Simulator(wl, parse_cluster(["A100-40GB:2"], GEO, 2), spec, pol, cfg)
        s.run()
        starts[reserve, after] = {j.id: s.out.start[s.index[j.id]] for j in wl.jobs}
    held, greedy, later = starts[True, 0.0], starts[False, 0.0], starts[True, 1200.0]
    assert held["short"] == 500.0 and held["gang"] == 1000.0 and held["long"] == 1500.0
    # without the hold the long job takes the GPU the short one leaves, and the gang times out
    assert greedy["long"] == 800.0 and math.isnan(greedy["gang"])
    # a gang that fits on one node is held only once it has waited 1,200 s: until then it competes as any job
    assert later["short"] == 500.0 and later["long"] == 800.0 and math.isnan(later["gang"])


def test_with_slack_a_job_ending_soon_after_the_hold_backfills_and_delays_the_gang_by_at_most_the_slack() -> None:
    # one node of two GPUs, busy until 1,000 and 500; the gang waits from t=10 and is held from 1,000 on; a
    # 600-s job could take the GPU freed at 500 and end at 1,100
    wl = Workload(name="slack", jobs=(
        _job("a", 0.0, 1000.0, mig("7g"), "7g"), _job("b", 0.0, 500.0, mig("7g"), "7g"),
        _job("gang", 10.0, 500.0, Demand(kind="gpus", gpus=2), "7g"),
        _job("medium", 20.0, 600.0, mig("7g"), "7g"), _job("long", 30.0, 5000.0, mig("7g"), "7g"),
    ))
    starts = {}
    for slack in (0.0, 200.0):
        spec, pol = get_policy("first-fit", reserve=True)
        cfg = SimConfig(interference=InterferenceParams(beta=0.0), check_invariants=True, reconfig_latency_s=0.0,
                        reserve_after_s=0.0, reserve_slack_s=slack)
        s = Simulator(wl, parse_cluster(["A100-40GB:2"], GEO, 2), spec, pol, cfg)
        s.run()
        starts[slack] = {j.id: s.out.start[s.index[j.id]] for j in wl.jobs}
    strict, relaxed = starts[0.0], starts[200.0]
    assert strict["gang"] == 1000.0 and strict["medium"] == 1500.0  # strict: it would end after the start
    # relaxed: it runs at once, and the gang starts 100 s late, within the 200-s slack; the long job, which
    # would end far past it, still waits behind the gang
    assert relaxed["medium"] == 500.0 and relaxed["gang"] == 1100.0 and relaxed["long"] >= 1600.0


def test_without_hints_nothing_backfills_onto_held_gpus() -> None:
    wl = _starving()
    spec, pol = get_policy("spread", reserve=True)
    cfg = SimConfig(interference=InterferenceParams(beta=0.0), hint_factor=0.0)
    s = Simulator(wl, parse_cluster(["A100-40GB:4"], GEO, 2), spec, pol, cfg)
    s.run()
    # with no hint no GPU's free time is known, so no reservation is ever planned: the gang starves as before
    gang = next(i for i, j in enumerate(wl.jobs) if j.id == "gang")
    assert not s.out.completed[gang]


def test_without_hints_a_default_expected_run_lets_a_hold_be_planned_and_the_gang_run() -> None:
    wl = _starving()
    spec, pol = get_policy("spread", reserve=True)
    # the 1g jobs run 1,000 s; planned as 1,200-s runs, their GPUs free in time for a hold within the patience
    cfg = SimConfig(interference=InterferenceParams(beta=0.0), hint_factor=0.0, default_hint_s=1200.0,
                    check_invariants=True)
    s = Simulator(wl, parse_cluster(["A100-40GB:4"], GEO, 2), spec, pol, cfg)
    s.run()
    gang = next(i for i, j in enumerate(wl.jobs) if j.id == "gang")
    assert s.out.completed[gang] and s.reserved_idle_s > 0.0
    # held once it had waited the 1,200 s a one-node gang waits: the small jobs give no hint, so none took a
    # held GPU, and the gang started by the time the jobs running then had ended
    assert s.out.start[gang] <= 350.0 + 1200.0 + 1000.0 + 1.0


def test_a_masked_snapshot_hides_held_gpus_from_a_policy() -> None:
    snap = _snap(1, 2)
    healthy = np.array([g.id != "g00" for g in snap.gpus], dtype=bool)
    masked = snap.with_columns(healthy=healthy)
    d = get_policy("first-fit")[1](masked, msgspec.convert({"job_id": "j", "demand": {"profile": "7g"}},
                                                          type=__import__("shared.policy.placement.decision",
                                                                          fromlist=["JobRequest"]).JobRequest))
    assert not isinstance(d, CannotPlace) and d.slot.gpu_id == "g01"


def test_a_job_is_expected_to_run_its_hint_else_the_default_else_no_one_knows_how_long() -> None:
    assert expected_run(600.0, 3600.0) == 600.0
    assert expected_run(0.0, 3600.0) == 0.0  # a hint of nothing is a hint: it ends now
    assert expected_run(None, 3600.0) == 3600.0
    assert expected_run(None, 0.0) is None
