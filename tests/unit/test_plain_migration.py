"""The migration planner over a mixed cluster: jobs on whole non-MIG GPUs and time-sliced shares never move,
and no MIG job is pulled onto a non-MIG GPU (the planner service reserves only what these plans name; the
``migrate`` transition refuses a plain job anyway, see ``tests/contract/state_cases/plain_state.py``)."""

from __future__ import annotations

import pytest

from shared.mig.geometry import default_geometry
from shared.policy.migration.planner import MigrationParams, plan_after_exit, plan_defrag
from shared.policy.snapshot import ClusterSnapshot, GpuView, snapshot_of
from shared.state import StoredGpu, StoredInstance

pytestmark = pytest.mark.unit
GEO = default_geometry()


def _snap() -> ClusterSnapshot:
    def busy(iid: str, profile: str, start: int, size: int, compute: int, job: str, mig: bool = True) -> StoredInstance:
        return StoredInstance(id=iid, profile=profile, start=start, size=size, compute=compute, state="busy",
                              job=job, mig=mig)

    gpus = [
        StoredGpu(id="n1/0", node="n1", index=0, model="A100-40GB", mig=False,
                  instances=[busy("w", "gpu", 0, 8, 7, "whole", mig=False)]),
        StoredGpu(id="n1/1", node="n1", index=1, model="A100-40GB", mig=False, replicas=4,
                  instances=[busy(f"s{r}", "shared", r, 0, 0, f"share{r}", mig=False) for r in range(3)]),
        StoredGpu(id="n1/2", node="n1", index=2, model="A100-40GB", mig=False, replicas=2),  # empty, plain
        StoredGpu(id="n1/3", node="n1", index=3, model="A100-40GB"),  # empty MIG GPU: a pull target
        StoredGpu(id="n1/4", node="n1", index=4, model="A100-40GB",
                  instances=[busy("m1", "1g.5gb", 0, 1, 1, "mig1"), busy("m2", "3g.20gb", 4, 4, 3, "mig2"),
                             busy("m3", "1g.5gb", 2, 1, 1, "mig3")]),
    ]
    views: list[GpuView] = [g.view() for g in gpus]
    return snapshot_of(GEO, views)


def test_plain_jobs_never_move_and_mig_jobs_never_land_on_plain_gpus() -> None:
    snap = _snap()
    params = MigrationParams(cooldown_s=0.0, max_moves=16)
    moves = [*plan_defrag(snap, 1000.0, params), *plan_after_exit(snap, "n1/2", 1000.0, params),
             *plan_after_exit(snap, "n1/3", 1000.0, params)]
    plain_jobs = {"whole", "share0", "share1", "share2"}
    assert not [m for m in moves if m.job_id in plain_jobs]
    assert not [m for m in moves if m.dst_gpu in ("n1/0", "n1/1", "n1/2") or m.src_gpu in ("n1/0", "n1/1")]
