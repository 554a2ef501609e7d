"""The migration planner: moves that lower FragCost, legal make-before-break, and the job's own rules."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mig_strategies import GEO, clusters, layout_is_legal
from reference_migration import exhaustive_pull

from shared.mig.occupancy import span
from shared.policy.fragcost import frag_cost
from shared.policy.migration.planner import MigrationParams, Move, plan_after_exit, plan_defrag
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of

pytestmark = pytest.mark.unit

NOW = 1000.0
PARAMS = st.builds(
    MigrationParams, threshold=st.sampled_from([0.2, 0.4, 0.6]), cooldown_s=st.sampled_from([0.0, 120.0]),
    max_moves=st.integers(0, 6), intra=st.booleans(), inter=st.booleans(),
)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def replay(snap: ClusterSnapshot, moves: tuple[Move, ...], params: MigrationParams) -> None:
    """Apply the moves one by one and check every rule the planner promises."""
    state = {g.id: list(g.instances) for g in snap.gpus}
    original = {i.job_id: i for g in snap.gpus for i in g.instances if i.busy}
    assert len(moves) <= params.max_moves
    assert len({m.job_id for m in moves}) == len(moves), "a job moved twice in one plan"
    for m in moves:
        src_model = GEO.model(snap.gpu(m.src_gpu).model)
        dst_model = GEO.model(snap.gpu(m.dst_gpu).model)
        src = next(i for i in state[m.src_gpu] if i.id == m.src_instance)
        job = original[m.job_id]
        assert src.job_id == m.job_id and (src.profile, src.start) == (m.src_profile, m.src_start)
        assert job.migratable and NOW - job.last_moved_at >= params.cooldown_s
        assert snap.gpu(m.dst_gpu).mig and snap.gpu(m.dst_gpu).healthy
        src_busy = _busy(state[m.src_gpu])
        dst_busy_before = _busy(state[m.dst_gpu])
        pm = span(m.dst_size, m.dst_start)
        dst_prof = dst_model.profile(m.dst_profile)
        assert m.dst_start in dst_prof.placements and m.dst_size == dst_prof.memory_slices
        # make-before-break: the destination is free of busy slices while the source still runs
        assert not dst_busy_before & pm
        in_way = {i.id for i in state[m.dst_gpu] if not i.busy and i.mask & pm}
        assert set(m.destroy) == in_way
        # both copies exist at once: the count must allow it
        during = [i for i in state[m.dst_gpu] if i.id not in in_way] + [
            InstanceView(id="new", profile=m.dst_profile, start=m.dst_start, size=m.dst_size,
                         compute=dst_prof.compute_slices, job_id=m.job_id)]
        assert sum(1 for i in during if i.profile == m.dst_profile) <= dst_prof.max_count
        if m.kind == "intra":
            assert m.src_gpu == m.dst_gpu and m.dst_profile == m.src_profile
            after = (src_busy & ~src.mask) | pm
            assert m.frag_src_before == pytest.approx(frag_cost(src_model, src_busy))
            assert m.frag_src_after == pytest.approx(frag_cost(src_model, after))
        else:
            assert m.src_gpu != m.dst_gpu and not job.latency_sensitive
            assert dst_prof.shape == src_model.profile(m.src_profile).shape
            assert m.frag_src_after == pytest.approx(frag_cost(src_model, src_busy & ~src.mask))
            assert m.frag_dst_after == pytest.approx(frag_cost(dst_model, dst_busy_before | pm))
            src_used = sum(i.compute for i in state[m.src_gpu] if i.busy) - src.compute
            dst_used = sum(i.compute for i in state[m.dst_gpu] if i.busy) + dst_prof.compute_slices
            assert dst_used / dst_model.compute_slices <= src_used / src_model.compute_slices + 1e-9
        assert m.expected_change < 0 and m.frag_src_after <= m.frag_src_before
        assert m.expected_change == pytest.approx(m.frag_src_after - m.frag_src_before)
        state[m.src_gpu] = [i for i in state[m.src_gpu] if i.id != src.id]
        state[m.dst_gpu] = [i for i in state[m.dst_gpu] if i.id not in in_way] + [
            InstanceView(id=f"moved-{m.job_id}", profile=m.dst_profile, start=m.dst_start, size=m.dst_size,
                         compute=dst_prof.compute_slices, job_id=m.job_id)]
        for gid in (m.src_gpu, m.dst_gpu):
            assert layout_is_legal(GEO.model(snap.gpu(gid).model), state[gid])


def _busy(insts: list[InstanceView]) -> int:
    m = 0
    for i in insts:
        if i.busy:
            m |= i.mask
    return m


@FAST
@given(snap=clusters(max_gpus=8), params=PARAMS, data=st.data())
def test_moves_planned_after_an_exit_are_legal_and_never_raise_fragcost(
    snap: ClusterSnapshot, params: MigrationParams, data: st.DataObject
) -> None:
    gpu = data.draw(st.sampled_from(snap.gpus))
    moves = plan_after_exit(snap, gpu.id, NOW, params)
    replay(snap, moves, params)
    if moves:
        load = gpu.used_compute / GEO.model(gpu.model).compute_slices
        busy = round(load * 1000) >= round(params.threshold * 1000)
        assert all(m.kind == ("intra" if busy else "inter") for m in moves)
        assert all((m.src_gpu if busy else m.dst_gpu) == gpu.id for m in moves)
        assert params.intra if busy else params.inter


@FAST
@given(snap=clusters(max_gpus=10), params=PARAMS)
def test_a_defragmentation_plan_is_legal_and_never_raises_fragcost(
    snap: ClusterSnapshot, params: MigrationParams
) -> None:
    replay(snap, plan_defrag(snap, NOW, params), params)


@FAST
@given(snap=clusters(max_gpus=8), params=PARAMS)
def test_planning_is_deterministic(snap: ClusterSnapshot, params: MigrationParams) -> None:
    assert plan_defrag(snap, NOW, params) == plan_defrag(snap, NOW, params)


def _inst(gid: str, profile: str, start: int, job: str | None, **kw: object) -> InstanceView:
    p = GEO.model("A100-40GB").profile(profile)
    return InstanceView(id=f"{gid}/{profile}@{start}", profile=profile, start=start, size=p.memory_slices,
                        compute=p.compute_slices, job_id=job, **kw)  # type: ignore[arg-type]


def _gpu(gid: str, *insts: InstanceView, model: str = "A100-40GB") -> GpuView:
    return GpuView.build(id=gid, node="n", index=int(gid[1:]), model=model, instances=insts)


# g0: 1g@0, 2g@2, 1g@6 busy: load 4/7, FragCost 0.831; moving 1g@6 next to 1g@0 lowers it
FRAGMENTED = ("g0", ("1g.5gb", 0, "j1"), ("2g.10gb", 2, "j2"), ("1g.5gb", 6, "j3"))


def _fragmented(**kw: object) -> GpuView:
    gid, *spec = FRAGMENTED
    return _gpu(gid, *(_inst(gid, p, s, j, **(kw if j == "j3" else {})) for p, s, j in spec))


def test_a_busy_gpu_moves_a_job_within_itself_to_lower_its_fragcost() -> None:
    snap = snapshot_of(GEO, [_fragmented()])
    moves = plan_after_exit(snap, "g0", NOW, MigrationParams())
    assert moves and moves[0].kind == "intra" and moves[0].job_id == "j3" and moves[0].dst_start == 1
    assert moves[0].frag_src_before == pytest.approx(0.831, abs=5e-4)
    assert moves[0].expected_change < 0


def test_an_intra_move_never_overlaps_its_own_source() -> None:
    # a lone 3g@4 would score better at... nowhere: 3g@0 overlaps nothing, but it is already optimal at 4
    snap = snapshot_of(GEO, [_gpu("g0", _inst("g0", "4g.20gb", 0, "a"))])
    assert plan_after_exit(snap, "g0", NOW, MigrationParams(threshold=0.1)) == ()
    # 2g@2 alone: 2g@4 lowers FragCost (0.562 -> 0.395) and does not overlap slices 2-3
    snap = snapshot_of(GEO, [_gpu("g0", _inst("g0", "2g.10gb", 2, "a"))])
    moves = plan_after_exit(snap, "g0", NOW, MigrationParams(threshold=0.1))
    assert [(m.src_start, m.dst_start) for m in moves] == [(2, 4)]


def test_a_job_in_cooldown_or_not_migratable_stays_put() -> None:
    snap = snapshot_of(GEO, [_fragmented(last_moved_at=NOW - 10)])
    moves = plan_after_exit(snap, "g0", NOW, MigrationParams())
    assert all(m.job_id != "j3" for m in moves)
    snap = snapshot_of(GEO, [_fragmented(migratable=False)])
    assert all(m.job_id != "j3" for m in plan_after_exit(snap, "g0", NOW, MigrationParams()))
    snap = snapshot_of(GEO, [_fragmented(last_moved_at=NOW - 121)])
    assert any(m.job_id == "j3" for m in plan_after_exit(snap, "g0", NOW, MigrationParams()))


def test_a_lazy_gpu_pulls_the_job_whose_removal_helps_the_busy_source_most() -> None:
    snap = snapshot_of(GEO, [_fragmented(), _gpu("g1", model="H200-141GB")])
    moves = plan_after_exit(snap, "g1", NOW, MigrationParams())
    assert len(moves) == 1
    m = moves[0]
    assert (m.kind, m.src_gpu, m.dst_gpu, m.dst_profile) == ("inter", "g0", "g1", "1g.18gb")
    assert m.expected_change == pytest.approx(m.frag_src_after - m.frag_src_before) and m.expected_change < 0


def test_a_latency_sensitive_job_moves_within_its_gpu_but_never_across() -> None:
    gid = "g0"
    insts = [_inst(gid, p, s, j, latency_sensitive=True) for p, s, j in FRAGMENTED[1:]]
    snap = snapshot_of(GEO, [_gpu(gid, *insts), _gpu("g1")])
    assert plan_after_exit(snap, "g1", NOW, MigrationParams()) == ()
    assert plan_after_exit(snap, "g0", NOW, MigrationParams())  # intra is allowed
    assert all(m.kind == "intra" for m in plan_defrag(snap, NOW, MigrationParams()))


def test_a_pull_never_leaves_the_target_more_loaded_than_the_source() -> None:
    # source: 3g busy (load 3/7); pulling it would leave the target at 3/7 and the source at 0
    snap = snapshot_of(GEO, [_gpu("g0", _inst("g0", "3g.20gb", 0, "a")), _gpu("g1")])
    assert plan_after_exit(snap, "g1", NOW, MigrationParams()) == ()


def test_a_pull_never_moves_a_job_to_a_profile_with_less_memory() -> None:
    h200 = GEO.model("H200-141GB").profile("1g.18gb")
    big = [InstanceView(id=f"h/{s}", profile=h200.name, start=s, size=1, compute=1, job_id=f"j{s}")
           for s in (0, 2, 4, 6)]
    snap = snapshot_of(GEO, [_gpu("g0", *big, model="H200-141GB"), _gpu("g1")])
    assert plan_after_exit(snap, "g1", NOW, MigrationParams()) == ()
    snap = snapshot_of(GEO, [_gpu("g0", *big, model="H200-141GB"), _gpu("g1", model="B200-180GB")])
    assert plan_after_exit(snap, "g1", NOW, MigrationParams())


def test_the_cap_on_moves_and_the_switches_are_honoured() -> None:
    snap = snapshot_of(GEO, [_fragmented(), _gpu("g1")])
    assert plan_defrag(snap, NOW, MigrationParams(max_moves=0)) == ()
    assert len(plan_defrag(snap, NOW, MigrationParams(max_moves=1))) == 1
    assert all(m.kind == "inter" for m in plan_defrag(snap, NOW, MigrationParams(intra=False)))
    assert all(m.kind == "intra" for m in plan_defrag(snap, NOW, MigrationParams(inter=False)))


def test_an_unknown_or_unhealthy_gpu_gets_no_moves() -> None:
    g = _fragmented()
    sick = GpuView.build(id=g.id, node=g.node, index=g.index, model=g.model, instances=g.instances,
                         healthy=False)
    snap = snapshot_of(GEO, [sick])
    assert plan_after_exit(snap, "g0", NOW, MigrationParams()) == ()
    assert plan_after_exit(snap, "nope", NOW, MigrationParams()) == ()
    assert plan_defrag(snap, NOW, MigrationParams()) == ()


def test_idle_instances_in_the_way_are_listed_for_destruction() -> None:
    idle = _inst("g0", "1g.5gb", 1, None)
    gpu = _gpu("g0", *[_inst("g0", p, s, j) for p, s, j in FRAGMENTED[1:]], idle)
    snap = snapshot_of(GEO, [gpu])
    moves = plan_after_exit(snap, "g0", NOW, MigrationParams())
    assert moves[0].dst_start == 1 and moves[0].destroy == (idle.id,)
    assert math.isfinite(moves[0].expected_change)


def _reference_defrag(snap: ClusterSnapshot, params: MigrationParams) -> tuple[Move, ...]:
    """plan_defrag without any pruning: every Busy GPU looked at, every source scanned for every target."""
    from shared.policy.migration.planner import _Plan

    plan = _Plan(snap, NOW, params)
    if params.max_moves <= 0:
        return ()
    usable = [v.id for p, v in enumerate(snap.gpus) if snap.mig[p] and snap.healthy[p]]
    if params.intra:
        while not plan.full():
            live = []
            for gid in usable:
                g = plan.gpu(gid)
                if plan.busy_tier(g):
                    f = plan.best_intra(g)
                    if f is not None:
                        live.append((f[0], g.pos, gid, f))
            if not live:
                break
            _, _, gid, f = min(live, key=lambda x: (x[0], x[1]))
            plan.apply_intra(plan.gpu(gid), f, "defragmentation, busy GPU")
    if params.inter:
        targets = sorted((plan.gpu(gid).load_q(), plan.gpu(gid).pos, gid) for gid in usable
                         if not plan.busy_tier(plan.gpu(gid)))
        for _, _, gid in targets:
            if plan.full():
                break
            exhaustive_pull(plan, plan.gpu(gid), "defragmentation, lazy GPU")
    return tuple(plan.moves)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(max_gpus=25), params=PARAMS)
def test_the_best_first_defragmentation_plans_what_an_exhaustive_search_plans(
    snap: ClusterSnapshot, params: MigrationParams
) -> None:
    assert plan_defrag(snap, NOW, params) == _reference_defrag(snap, params)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(max_gpus=25), data=st.data())
def test_the_best_first_pull_finds_what_an_exhaustive_scan_finds(
    snap: ClusterSnapshot, data: st.DataObject
) -> None:
    from shared.policy.migration.planner import _Plan

    gpu = data.draw(st.sampled_from(snap.gpus))
    params = MigrationParams(cooldown_s=data.draw(st.sampled_from([0.0, 120.0])))
    fast, slow = _Plan(snap, NOW, params), _Plan(snap, NOW, params)
    if not fast.usable(gpu.id):
        return
    assert fast.pull_into(fast.gpu(gpu.id), "x") == exhaustive_pull(slow, slow.gpu(gpu.id), "x")
    assert fast.moves == slow.moves
