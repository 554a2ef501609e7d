"""The ``fluid`` bound, the per-class KPIs and rejected GPU-hours, and the matrix's verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shared.mig.geometry import default_geometry
from shared.policy.placement.decision import JobRequest, Placement
from shared.policy.placement.registry import get_policy, parse_label
from shared.policy.request import Demand, mig
from shared.policy.snapshot import GpuView, snapshot_of
from shared.sim import experiment, matrix
from shared.sim.classes import class_gpus, demand_class, gpu_equivalents
from shared.sim.cluster import parse_cluster
from shared.sim.config import InterferenceParams, SimConfig
from shared.sim.fluid import run_fluid
from shared.sim.jobs import SimJob, Workload
from shared.sim.workloads.synthetic import synthetic

pytestmark = pytest.mark.unit

GEO = default_geometry()
CFG = SimConfig(interference=InterferenceParams(beta=0.0), patience_s=100.0)


def _wl(*jobs: SimJob) -> Workload:
    return Workload(name="t", jobs=tuple(sorted(jobs, key=lambda j: (j.arrival, j.id))))


def test_the_pool_runs_a_job_that_no_gpu_has_the_right_hole_for() -> None:
    # two GPUs, each holding a long 4g: 6 compute slices free, in two 3-slice holes where no 4g can start
    wl = _wl(SimJob(id="a", arrival=0.0, duration=1000.0, demand=mig("4g"), shape="4g"),
             SimJob(id="b", arrival=0.0, duration=1000.0, demand=mig("4g"), shape="4g"),
             SimJob(id="c", arrival=1.0, duration=10.0, demand=mig("4g"), shape="4g"))
    cluster = parse_cluster(["A100-40GB:2"], GEO)
    real = experiment.run_one(wl, cluster, "first-fit", CFG).kpis
    pooled = run_fluid(wl, cluster, CFG).kpis
    assert (real.completed, real.classes["4g"].rejected) == (2, 1)
    assert pooled.completed == 3
    # a whole GPU needs 7 compute slices, more than the pool has left while the 4g jobs run
    big = _wl(*wl.jobs[:2], SimJob(id="e", arrival=2.0, duration=10.0, demand=Demand(kind="gpus", gpus=1),
                                   shape="7g"))
    k = run_fluid(big, cluster, CFG).kpis
    assert k.completed == 2 and k.classes["1gpu"].rejected == 1


def test_the_bound_keeps_every_job_accounted_and_is_deterministic() -> None:
    wl = synthetic(np.random.default_rng(2), jobs=300, load=1.4, cluster_slices=4 * 7)
    cluster = parse_cluster(["A100-40GB:4"], GEO)
    a, b = run_fluid(wl, cluster, CFG).kpis, run_fluid(wl, cluster, CFG).kpis
    assert a.completed + a.rejected == a.jobs == 300 and a.rejected > 0
    assert (a.completed, a.rejected, a.wait_mean_s) == (b.completed, b.rejected, b.wait_mean_s)
    assert 0 < a.utilization <= 1


def test_classes_add_up_to_the_run_and_rejected_work_is_what_the_rejected_jobs_asked() -> None:
    wl = synthetic(np.random.default_rng(4), jobs=300, load=1.5, cluster_slices=4 * 7)
    r = experiment.run_one(wl, parse_cluster(["A100-40GB:4"], GEO), "first-fit", CFG)
    k = r.kpis
    assert sum(c.jobs for c in k.classes.values()) == k.jobs
    assert sum(c.rejected for c in k.classes.values()) == k.rejected > 0
    assert math.isclose(sum(c.rejected_gpu_h for c in k.classes.values()), k.rejected_gpu_h, rel_tol=1e-6)
    assert list(k.classes)[:2] == sorted(list(k.classes)[:2], key=lambda n: int(n[0]))  # 1g before 2g ...


def test_a_job_is_judged_in_its_shape_or_its_gpu_count() -> None:
    assert demand_class(SimJob(id="a", arrival=0, duration=1, demand=mig("3g"), shape="3g")) == "3g"
    gang = SimJob(id="b", arrival=0, duration=1, demand=Demand(kind="gpus", gpus=8), shape="7g")
    assert demand_class(gang) == "8gpu" and gpu_equivalents(gang) == 8.0
    assert class_gpus(demand_class(gang)) == 8 and class_gpus("3g") == 0 and class_gpus("shared") == 0
    assert gpu_equivalents(SimJob(id="c", arrival=0, duration=1, demand=mig("2g"), shape="2g")) == 2 / 7


def _row(group: str, label: str, rej: float, wait: float = 10.0, worst: float = 0.5, gh: float = 10.0,
         mig_share: float = 0.0, reconf: float = 100.0) -> matrix.Row:
    return matrix.Row(group=group, label=label, seeds=1, rejection=rej, rejection_sd=0.0, rejected_gpu_h=gh,
                      worst_class="7g", worst_class_rate=worst, wait_mean_s=wait, wait_p95_s=wait, jct_mean_s=1.0,
                      utilization=0.5, migrated_share=mig_share, reconfigurations=reconf, classes={"7g": worst})


def test_a_cell_is_judged_against_its_best_baseline_and_the_fluid_bound() -> None:
    table = [_row("c", "first-fit", 0.10), _row("c", "best-fit", 0.08, wait=20.0), _row("c", "fluid", 0.04),
             _row("c", "migsched", 0.06, wait=21.0, worst=0.2, gh=9.0, reconf=105.0)]
    (v,) = matrix.verdicts(table)
    assert v.best_baseline == "best-fit" and v.within and v.wait_ok and v.fewer_15 and v.no_starving
    assert v.gap_closed == pytest.approx(0.5) and v.gpu_h_ok and v.reconfig_ok
    table[-1] = _row("c", "migsched", 0.0815, wait=23.0, worst=0.3, gh=11.0, reconf=120.0)
    (v,) = matrix.verdicts(table)
    assert not v.within and not v.wait_ok and not v.fewer_15 and not v.no_starving and not v.gpu_h_ok
    assert not v.reconfig_ok


def test_a_policy_label_carries_its_parameters() -> None:
    assert parse_label("migsched[reserve=off,keep_empty=0.2]") == (
        "migsched", {"reserve": False, "keep_empty": 0.2})
    assert parse_label("fgd") == ("fgd", {})


def test_a_whole_number_in_a_label_stays_an_int_so_a_count_parameter_works() -> None:
    name, params = parse_label("migsched[top_k=2,keep_empty=1.0]")
    assert params == {"top_k": 2, "keep_empty": 1.0} and isinstance(params["top_k"], int)
    _, policy = get_policy(name, **params)  # top_k slices the runners-up: a float would fail there
    snap = snapshot_of(GEO, [GpuView.build(id=f"g{i}", node="n", index=i, model="A100-40GB") for i in range(4)])
    placed = policy(snap, JobRequest(job_id="j", demand=mig("1g")))
    assert isinstance(placed, Placement) and len(placed.candidates) == 2


def test_compare_runs_a_labelled_policy_with_its_parameters_under_its_label() -> None:
    wl = Workload(name="w", jobs=tuple(
        SimJob(id=f"j{i}", arrival=float(i), duration=50.0, demand=Demand(kind="gpus", gpus=2), shape="7g")
        for i in range(4)))
    cfg = SimConfig(interference=InterferenceParams(beta=0.0))
    runs = experiment.compare(wl, parse_cluster(["A100-40GB:4"], GEO, 2), ["first-fit", "first-fit[reserve=on]"], cfg)
    assert [r.kpis.policy for r in runs] == ["first-fit", "first-fit[reserve=on]"]


def test_the_matrix_judges_each_openb_cell_as_recorded_and_in_jittered_replays() -> None:
    openb = [c for c in matrix.cells() if c.workload.startswith("openb")]
    groups: dict[str, list[matrix.Cell]] = {}
    for c in openb:
        groups.setdefault(c.group, []).append(c)
    assert len(groups) == 13  # four traces at three sizes, and default with DLRM beside it
    for same in groups.values():
        assert [(c.seed, c.jitter_s) for c in same] == [(0, 0.0), *((s, matrix.OPENB_JITTER_S) for s in (1, 2))]
    assert {c.seed for c in matrix.cells(quick=True) if c.workload.startswith("openb")} == {0}


def test_a_matrix_run_writes_its_table_verdict_and_plot(tmp_path: object) -> None:
    from pathlib import Path

    cells = [matrix.Cell(workload="synthetic", gpus=8, load=1.3, seed=s) for s in (0, 1)]
    labels = ["first-fit", "best-fit", "migsched", "migsched[reserve=off]", "fluid"]
    runs = matrix.run_matrix(cells, labels, SimConfig(patience_s=1800.0), synthetic_jobs=150)
    assert len(runs) == len(cells) * len(labels)
    written = matrix.write(Path(str(tmp_path)), runs, command="migsched simulate --matrix")
    md = (Path(str(tmp_path)) / "matrix.md").read_text()
    assert "synthetic@8 load 1.3" in md and "migsched[reserve=off]" in md and "## Targets of `migsched`" in md
    (row,) = [r for r in matrix.rows(runs) if r.label == "migsched"]
    assert row.seeds == 2 and 0.0 <= row.rejection <= 1.0
    assert {p.name for p in written} >= {"matrix.md", "matrix.json"}
    # the difference to the best baseline is paired run by run: its spread is that of the per-seed differences
    (v,) = matrix.verdicts(matrix.rows(runs), "migsched", runs)
    rate = {(r.cell.seed, r.label): r.kpis.rejection_rate for r in runs}
    per_seed = [rate[s, "migsched"] - rate[s, v.best_baseline] for s in (0, 1)]
    assert v.paired_sd == pytest.approx(float(np.std(per_seed)))
    assert f"{100 * (v.rejection - v.best_rejection):+.2f} ± {100 * float(np.std(per_seed)):.2f}" in md
    (alone,) = matrix.verdicts(matrix.rows(runs), "migsched")
    assert alone.paired_sd is None  # without the runs there is nothing to pair
    # every policy that is neither a baseline nor the bound gets its own verdict, variants by their full label
    assert "## Targets of `migsched[reserve=off]`" in md and "## Targets of `first-fit`" not in md
    assert "Cells where `migsched[reserve=off]` meets each target: rejection" in md


def test_the_matrix_judges_every_policy_but_the_baselines_and_the_bound_in_the_order_given() -> None:
    labels = ["first-fit", "best-fit", "fgd", "spread", "migsched[in_time=off]", "paper", "fluid",
              "first-fit[reserve=on]", "migsched[in_time=off]"]
    assert matrix.candidates(labels) == ["migsched[in_time=off]", "paper", "first-fit[reserve=on]"]
    assert matrix.candidates(matrix.BASELINES) == []
