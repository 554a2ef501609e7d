"""The defragmentation tick's per-GPU intra bound never promises less than a GPU's best intra move."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mig_strategies import clusters

from shared.policy.migration.planner import MigrationParams, _Plan
from shared.policy.migration.search import move_bounds
from shared.policy.snapshot import ClusterSnapshot, snapshot_of

pytestmark = pytest.mark.unit

NOW = 1000.0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(max_gpus=20), cooldown=st.sampled_from([0.0, 120.0]))
def test_the_intra_bound_is_at_most_the_best_intra_change_and_at_least_the_busy_mask_bound(
    snap: ClusterSnapshot, cooldown: float
) -> None:
    plan = _Plan(snap, NOW, MigrationParams(cooldown_s=cooldown))
    bound = plan.columns()[3]
    for p, view in enumerate(snap.gpus):
        model = plan.model_at(p)
        found = plan.best_intra(plan.peek(p))
        if found is not None:
            assert bound[p] <= found[0][0] < 0
        # never looser than the bound from the busy mask alone
        assert bound[p] >= move_bounds(model)[1][view.busy_mask]


def test_a_gpu_whose_only_job_sits_where_no_move_helps_gets_no_intra_bound() -> None:
    from shared.mig.geometry import default_geometry
    from shared.policy.snapshot import GpuView, InstanceView

    geo = default_geometry()
    model = geo.model("A100-40GB")
    prof = next(p for p in model.profiles if p.memory_slices == model.memory_slices)
    whole = InstanceView(id="i", profile=prof.name, start=0, size=prof.memory_slices,
                         compute=prof.compute_slices, job_id="j")
    snap = snapshot_of(geo, [GpuView.build(id="g", node="n", index=0, model=model.name,
                                                  instances=[whole])])
    assert _Plan(snap, NOW, MigrationParams()).columns()[3].tolist() == [0]
