"""What a replay publishes (``migsched.replayer``): every job by default, one MIG instance a job for the demo's
comparison, and one-GPU jobs as ``gpus: 1`` for clusters whose GPUs are not in MIG mode."""

from __future__ import annotations

import pytest

from migsched.replayer import single_instance, whole_as_gpus
from shared.mig.geometry import default_geometry
from shared.policy.request import Demand
from shared.sim.jobs import SimJob, Workload

pytestmark = pytest.mark.unit
GEO = default_geometry()


def _workload() -> Workload:
    def job(jid: str, demand: Demand, shape: str) -> SimJob:
        return SimJob(id=jid, arrival=0.0, duration=60.0, demand=demand, shape=shape)

    return Workload(name="w", jobs=(job("whole", Demand(kind="mig", profile="7g"), "7g"),
                                    job("named", Demand(kind="mig", profile="7g.40gb"), "7g"),
                                    job("small", Demand(kind="mig", profile="3g"), "3g"),
                                    job("gang", Demand(kind="gpus", gpus=2), "7g"),
                                    job("share", Demand(kind="shared"), "shared")))


def test_one_gpu_jobs_go_out_as_gpus_1_and_nothing_else_changes() -> None:
    out = {j.id: j.demand for j in whole_as_gpus(_workload(), GEO.model("A100-40GB")).jobs}
    assert out["whole"] == out["named"] == Demand(kind="gpus", gpus=1)
    assert out["small"] == Demand(kind="mig", profile="3g") and out["gang"] == Demand(kind="gpus", gpus=2)
    assert out["share"] == Demand(kind="shared")
    # on an A30 the whole GPU is a 4g: a 7g request is no whole GPU there and stays as it is
    assert {j.id: j.demand for j in whole_as_gpus(_workload(), GEO.model("A30-24GB")).jobs}["whole"] == Demand(
        kind="mig", profile="7g")


def test_the_demo_replay_keeps_one_mig_instance_a_job_and_counts_the_rest() -> None:
    kept, skipped = single_instance(_workload())
    assert [j.id for j in kept.jobs] == ["whole", "named", "small"]
    assert skipped == {"gang (n whole GPUs)": 1, "time-sliced share": 1}
