"""What a replay publishes (``migsched.replayer``): every job by default, one MIG instance a job for the demo's
comparison, and one-GPU jobs as ``gpus: 1`` for clusters whose GPUs are not in MIG mode."""

from __future__ import annotations

import pytest

from migsched.replayer import load, single_instance, whole_as_gpus
from shared.mig.geometry import default_geometry
from shared.policy.request import Demand
from shared.sim.errors import WorkloadError
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


def test_a_named_synthetic_mix_is_replayed_as_the_simulator_draws_it_gangs_across_nodes_included() -> None:
    model = GEO.model("A100-40GB")
    gangs = load("synthetic:gangs", model, limit=400, seed=1, gpus=256)
    assert len(gangs.jobs) == 400
    assert max(j.demand.gpus or 0 for j in gangs.jobs) > 8  # bigger than a node
    assert len(load("synthetic:gangs", model, jobs=50, gpus=256).jobs) == 50  # `replay --jobs` counts any mix
    plain = load("synthetic", model, limit=400, seed=1, gpus=256)  # the demo's: no job of several GPUs
    assert all(j.demand.kind == "mig" for j in plain.jobs)
    with pytest.raises(WorkloadError, match="unknown synthetic mix 'big': one of default, gangs"):
        load("synthetic:big", model)


def test_the_demo_refuses_a_trace_it_cannot_read_before_it_starts_anything() -> None:
    from click.testing import CliRunner

    from migsched.cli import main

    r = CliRunner().invoke(main, ["up", "--demo", "--trace", "synthetic:big"])
    assert r.exit_code == 2 and "unknown synthetic mix 'big'" in r.output
    assert "migsched up" not in r.output and "stopped:" not in r.output  # nothing was started
