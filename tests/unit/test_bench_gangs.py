"""``load/bench_gangs.py``: the gang benchmark's figures mean what its table says."""

from __future__ import annotations

from pathlib import Path

import pytest

from load.bench_gangs import BIG, COLUMNS, SIZE_COLUMNS, Figures, Source, paired, run
from shared.mig.geometry import default_geometry
from shared.sim.cluster import parse_cluster
from shared.sim.workloads.spec import WorkloadSpec, build

pytestmark = pytest.mark.unit


def _run(label: str) -> Figures:
    return run(128, 1, label, Source(jobs=600, load=1.0), patience_s=86400.0)


def _figures(label: str) -> dict[str, float]:
    return dict(zip(COLUMNS, _run(label).row, strict=True))


def test_a_rejected_gang_counts_at_its_patience_and_only_reservations_hold_gpus_idle() -> None:
    held, greedy = _figures("migsched"), _figures("migsched[reserve=off]")
    # over 5 % of the big gangs are turned away without holds, so the p95 is a rejected gang's full patience
    assert greedy["big rejected"] > 0.05 and greedy["big wait p95 h"] == pytest.approx(24.0)
    assert held["big rejected"] < greedy["big rejected"]
    assert held["held idle"] > 0.0 and greedy["held idle"] == 0.0
    assert held["small wait mean s"] > 0.0 and held["rejected"] <= greedy["rejected"]


def test_a_difference_to_the_reference_is_paired_seed_by_seed() -> None:
    def figures(big: float, p95: float, small: float) -> list[float]:
        row = [0.0] * len(COLUMNS)
        row[COLUMNS.index("big rejected")], row[COLUMNS.index("big wait p95 h")] = big, p95
        row[COLUMNS.index("small wait mean s")] = small
        return row

    mine = [figures(0.01, 20.0, 30.0), figures(0.03, 18.0, 40.0)]
    ref = [figures(0.02, 19.0, 10.0), figures(0.02, 19.0, 20.0)]
    d = paired(mine, ref)
    assert d["big rejected"] == pytest.approx((0.0, 0.01))  # -0.01 then +0.01
    assert d["big wait p95 h"] == pytest.approx((0.0, 1.0))
    assert d["small wait mean s"] == pytest.approx((20.0, 0.0))  # the same gap in both: no spread


def test_the_big_gangs_split_by_size_add_up_to_the_pooled_rejection() -> None:
    figures = _run("migsched[reserve=off]")
    assert figures.sizes and min(figures.sizes) >= BIG
    pooled = dict(zip(COLUMNS, figures.row, strict=True))
    by_size = {n: dict(zip(SIZE_COLUMNS, v, strict=True)) for n, v in figures.sizes.items()}
    # the sizes' rejected shares, weighted by how many gangs of each size there are, give the pooled share
    counts = _gang_counts()
    weighted = sum(by_size[n]["rejected"] * counts[n] for n in by_size) / sum(counts[n] for n in by_size)
    assert weighted == pytest.approx(pooled["big rejected"])
    # a size with a rejected gang among its last twentieth has its p95 at the full patience
    assert any(v["rejected"] > 0.05 and v["wait p95 h"] == pytest.approx(24.0) for v in by_size.values())


def _gang_counts() -> dict[int, int]:
    geo = default_geometry()
    wl = build(WorkloadSpec(name="synthetic:gangs", seed=1, jobs=600, load=1.0),
               parse_cluster(["A100-40GB:128"], geo), geo)
    counts: dict[int, int] = {}
    for j in wl.jobs:
        if j.demand.kind == "gpus" and j.demand.gpus >= BIG:
            counts[j.demand.gpus] = counts.get(j.demand.gpus, 0) + 1
    return counts


def test_a_trace_of_whole_gpus_replays_with_its_one_gpu_jobs_as_the_small_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIGSCHED_TRACES_DIR", str(tmp_path))
    (tmp_path / "microsoft-itp-2021").mkdir()
    # ITP's columns: a 16-GPU gang holds both nodes for an hour; a one-GPU job arrives 10 s in and waits for it
    (tmp_path / "microsoft-itp-2021" / "cluster04.csv").write_text(
        "job_id,submission_time,duration,num_gpu\ng,0,3600,16\ns,10,60,1\n")
    row = run(16, 0, "first-fit", Source(workload="itp:cluster04"), patience_s=86400.0).row
    figures = dict(zip(COLUMNS, row, strict=True))
    assert figures["rejected"] == 0.0 and figures["big rejected"] == 0.0
    assert 3590.0 <= figures["small wait mean s"] < 3700.0  # the gang's hour, plus its instances' creation


def test_a_trace_is_replayed_as_recorded_for_seed_0_and_jittered_for_any_other() -> None:
    source = Source(workload="itp:cluster04", jitter_s=30.0)
    assert source.spec(0).jitter_s == 0.0 and source.spec(3).jitter_s == 30.0 and source.spec(3).seed == 3
    assert Source().spec(3).name == "synthetic:gangs" and Source().spec(3).seed == 3
