"""The planner's columns that the snapshot builder keeps equal what the planner used to compute per plan."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from mig_strategies import clusters

from shared.mig.tables import tables_for
from shared.policy.migration.search import removal_by_starts
from shared.policy.snapshot import ClusterSnapshot

pytestmark = pytest.mark.unit

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(snap=clusters(max_gpus=16))
def test_movable_drops_are_the_removal_table_at_the_movable_starts_whether_kept_or_derived(
    snap: ClusterSnapshot,
) -> None:
    derived = snap.with_columns()  # a snapshot that derives its columns instead of reading the builder's
    for p, gpu in enumerate(snap.gpus):
        model = snap.models[gpu.model]
        for name, k in tables_for(model).index.items():
            starts = 0
            for i in gpu.instances:
                if i.busy and i.migratable and not i.latency_sensitive and i.profile == name:
                    starts |= 1 << i.start
            want = int(removal_by_starts(model, name)[(gpu.busy_mask << 8) | starts])
            assert int(snap.movable_starts[p, k]) == starts
            assert int(snap.movable_drops[p, k]) == want == int(derived.movable_drops[p, k])


@FAST
@given(snap=clusters(max_gpus=16))
def test_load_and_size_columns_match_the_planners_formulas(snap: ClusterSnapshot) -> None:
    want = np.rint(np.asarray(snap.used, dtype=np.float64) * 1000.0
                   / np.maximum(np.asarray(snap.compute), 1)).astype(np.int64)
    assert (snap.load_q == want).all() and (snap.with_columns().load_q == want).all()
    assert (snap.cu_idx == (np.asarray(snap.compute, dtype=np.intp) << 4 | snap.used)).all()
