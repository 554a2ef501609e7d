"""Consolidation (``MigrationParams.consolidate``): emptying a lightly used GPU onto GPUs that run jobs."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mig_strategies import GEO, clusters, layout_is_legal

from shared.mig.occupancy import span
from shared.policy.migration.planner import MigrationParams, plan_after_exit
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of

pytestmark = pytest.mark.unit

NOW = 1000.0
CONSOLIDATE = MigrationParams(consolidate=True, pull_into_empty=False)


def _inst(gid: str, profile: str, start: int, job: str | None, **kw: object) -> InstanceView:
    p = GEO.model("A100-40GB").profile(profile)
    return InstanceView(id=f"{gid}/{profile}@{start}", profile=profile, start=start, size=p.memory_slices,
                        compute=p.compute_slices, job_id=job, **kw)  # type: ignore[arg-type]


def _gpu(gid: str, *insts: InstanceView) -> GpuView:
    return GpuView.build(id=gid, node="n", index=int(gid[1:]), model="A100-40GB", instances=insts)


def test_a_lazy_gpu_left_with_one_small_job_is_emptied_onto_a_gpu_that_already_runs_jobs() -> None:
    snap = snapshot_of(GEO, [
        _gpu("g0", _inst("g0", "1g.5gb", 6, "small")),
        _gpu("g1"),  # empty: never a target, it is what consolidation keeps for whole-GPU jobs
        _gpu("g2", _inst("g2", "4g.20gb", 0, "big")),
    ])
    moves = plan_after_exit(snap, "g0", NOW, CONSOLIDATE)
    assert [(m.job_id, m.src_gpu, m.dst_gpu, m.kind) for m in moves] == [("small", "g0", "g2", "inter")]
    assert not span(moves[0].dst_size, moves[0].dst_start) & span(4, 0)


def test_consolidation_is_all_or_nothing() -> None:
    # g0 keeps two 3g jobs; the only non-empty GPU has room for one of them: nothing leaves g0
    snap = snapshot_of(GEO, [
        _gpu("g0", _inst("g0", "3g.20gb", 0, "a"), _inst("g0", "3g.20gb", 4, "b")),
        _gpu("g1", _inst("g1", "4g.20gb", 0, "big")),
        _gpu("g2"),
    ])
    moves = plan_after_exit(snap, "g0", NOW, MigrationParams(consolidate=True, threshold=0.9))
    assert all(m.src_gpu != "g0" for m in moves)


def test_a_job_that_may_not_move_keeps_its_gpu_from_being_consolidated() -> None:
    snap = snapshot_of(GEO, [
        _gpu("g0", _inst("g0", "1g.5gb", 6, "pinned", migratable=False)),
        _gpu("g2", _inst("g2", "4g.20gb", 0, "big")),
    ])
    assert plan_after_exit(snap, "g0", NOW, CONSOLIDATE) == ()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(max_gpus=8), data=st.data(), max_moves=st.integers(0, 6))
def test_a_consolidation_plan_is_legal_empties_its_gpu_and_never_raises_the_source_fragcost(
    snap: ClusterSnapshot, data: st.DataObject, max_moves: int
) -> None:
    gpu = data.draw(st.sampled_from(snap.gpus))
    params = MigrationParams(consolidate=True, pull_into_empty=False, intra=False, inter=False,
                             max_moves=max_moves)
    moves = plan_after_exit(snap, gpu.id, NOW, params)
    state = {g.id: list(g.instances) for g in snap.gpus}
    assert len(moves) <= max_moves and len({m.job_id for m in moves}) == len(moves)
    for m in moves:
        assert m.kind == "inter" and m.src_gpu == gpu.id and m.dst_gpu != gpu.id
        assert m.frag_src_after <= m.frag_src_before  # taking a job off never raises FragCost
        dst_model = GEO.model(snap.gpu(m.dst_gpu).model)
        pm = span(m.dst_size, m.dst_start)
        assert not any(i.busy and i.mask & pm for i in state[m.dst_gpu]), "destination slices are busy"
        assert any(i.busy for i in state[m.dst_gpu]), "consolidation moved a job onto an empty GPU"
        prof = dst_model.profile(m.dst_profile)
        state[m.dst_gpu] = [i for i in state[m.dst_gpu] if i.busy or not i.mask & pm] + [
            InstanceView(id=f"moved-{m.job_id}", profile=m.dst_profile, start=m.dst_start, size=m.dst_size,
                         compute=prof.compute_slices, job_id=m.job_id)]
        state[m.src_gpu] = [i for i in state[m.src_gpu] if i.id != m.src_instance]
        assert layout_is_legal(dst_model, state[m.dst_gpu])
    if moves:  # all or nothing: the GPU ends with no job
        assert not any(i.busy for i in state[gpu.id])
