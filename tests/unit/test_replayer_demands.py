"""What a replay publishes (``migsched.replayer``): every job by default, what GPUs in MIG mode run for the demo's
comparison, one MIG instance a job with ``--mig-only``, and one-GPU jobs as ``gpus: 1`` for clusters whose GPUs
are not in MIG mode; and how the live KPIs weigh what was replayed (``migsched.livekpis``)."""

from __future__ import annotations

import pytest

from migsched import livekpis
from migsched.replayer import Replay, load, on_mig_gpus, single_instance, whole_as_gpus
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


def test_a_mig_only_replay_keeps_one_mig_instance_a_job_and_counts_the_rest() -> None:
    kept, skipped = single_instance(_workload())
    assert [j.id for j in kept.jobs] == ["whole", "named", "small"]
    assert skipped == {"gang (n whole GPUs)": 1, "time-sliced share": 1}


def test_the_demo_replay_keeps_what_gpus_in_mig_mode_run_gangs_included_and_counts_the_shares() -> None:
    kept, skipped = on_mig_gpus(_workload())
    assert [j.id for j in kept.jobs] == ["whole", "named", "small", "gang"]
    assert skipped == {"time-sliced share": 1}


def test_the_live_utilisation_counts_every_gpu_a_gang_held() -> None:
    wl, _ = on_mig_gpus(_workload())
    replay = Replay(workload="w", speedup=10.0, jobs=4, skipped={}, started_at=100.0, t0=0.0)
    # every job submitted at 100 s, run from 101 to 111 s of wall time: 100 trace seconds each, makespan 110
    outcomes = {j.id: livekpis.JobOutcome(job_id=j.id, state="finished", submitted=100.0, started=101.0,
                                          finished=111.0) for j in wl.jobs}
    k = livekpis.kpis(wl, replay, outcomes, [], GEO, "A100-40GB", 4)
    busy = (7 + 7 + 3 + 2 * 7) * 100.0  # slices x trace seconds: two 7g, a 3g, and the gang's two GPUs
    assert k["utilization"] == round(busy / (4 * 7 * 110.0), 6)
    assert k["completed"] == 4 and k["wait_mean_s"] == 10.0
    assert (k["gangs"], k["gangs_completed"], k["gang_wait_mean_s"]) == (1, 1, 10.0)


def test_a_simulated_runs_gang_kpis_are_read_from_its_gang_classes() -> None:
    wl, _ = on_mig_gpus(_workload())
    k = livekpis.comparable(livekpis.simulated_run(wl, 1, 2, "A100-40GB"))
    # one node of two GPUs: the gang of two takes both once the 7g jobs before it have ended
    assert (k["gangs"], k["gangs_completed"]) == (1, 1)
    assert k["gang_wait_mean_s"] > 0.0


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
