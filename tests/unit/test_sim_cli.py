"""``migsched simulate`` end to end on a tiny workload: files written, KPI JSON contract, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from migsched.commands.simulate import command

pytestmark = pytest.mark.unit

CONTRACT = (
    "jobs",
    "completed",
    "rejected",
    "rejection_rate",
    "jct_mean_s",
    "jct_p50_s",
    "jct_p95_s",
    "jct_p99_s",
    "wait_mean_s",
    "makespan_s",
    "utilization",
    "frag_rate_mean",
    "frag_rate_peak",
    "reconfigurations",
    "migrations",
    "migrated_share",
    "events",
    "wall_s",
)


def test_simulate_writes_the_report_the_kpi_json_and_the_plots(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(
        command,
        [
            "-w",
            "synthetic",
            "--jobs",
            "60",
            "--load",
            "1.2",
            "--cluster",
            "A100-40GB:4",
            "--gpus-per-node",
            "2",
            "-p",
            "migsched",
            "-p",
            "first-fit",
            "--sweep-threshold",
            "0.3,0.5",
            "--ablation",
            "--no-progress",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    kpis = json.loads((out / "kpis.json").read_text())
    assert [k["policy"] for k in kpis] == [
        "migsched",
        "first-fit",
        "paper",
        "paper",
        "lb-static",
        "paper-nomig",
        "paper",
    ]
    assert [k["threshold"] for k in kpis[2:4]] == [0.3, 0.5]
    for k in kpis:
        assert all(key in k for key in CONTRACT)
    for name in (
        "report.md",
        "series.json",
        "utilization.png",
        "fragmentation.png",
        "jct_cdf.png",
        "kpi_bars.png",
        "sweep_threshold_sweep.png",
        "ablation_kpi_bars.png",
    ):
        assert (out / name).stat().st_size > 0, name
    assert "Threshold sweep" in (out / "report.md").read_text()


def test_simulate_replays_a_csv_with_a_mapping_given_on_the_command_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("submit,run,frac\n0,100,0.1\n5,50,0.3\n9,20,1.0\n")
    res = CliRunner().invoke(
        command,
        [
            "-w",
            f"csv:{trace}",
            "--csv-map",
            "arrival=submit,duration=run,gpu_fraction=frac",
            "--cluster",
            "A100-40GB:1",
            "-p",
            "migsched",
            "--no-progress",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert res.exit_code == 0, res.output
    (k,) = json.loads((tmp_path / "o" / "kpis.json").read_text())
    assert k["jobs"] == 3 and k["completed"] == 3


def test_simulate_jitter_replays_the_trace_with_moved_arrivals_and_says_so(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("submit,run,frac\n" + "".join(f"{10 * i},{300 + i},0.5\n" for i in range(30)))

    def run(*extra: str) -> dict[str, object]:
        out = tmp_path / f"o{len(extra)}"
        res = CliRunner().invoke(command, [
            "-w", f"csv:{trace}", "--csv-map", "arrival=submit,duration=run,gpu_fraction=frac",
            "--cluster", "A100-40GB:1", "-p", "first-fit", *extra, "--no-progress", "--out", str(out)])
        assert res.exit_code == 0, res.output
        assert ("jittered by up to 40 s" in (out / "report.md").read_text()) == bool(extra)
        (k,) = json.loads((out / "kpis.json").read_text())
        return dict(k)

    plain, moved = run(), run("--jitter", "40", "--seed", "3")
    assert plain["jobs"] == moved["jobs"] == 30
    assert plain["wait_mean_s"] != moved["wait_mean_s"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-w", "csv:x.csv"], "needs the file and --csv-map"),
        (["-w", "bogus"], "unknown workload"),
        (["--cluster", "A100-40GB"], "MODEL:COUNT"),
        (["-w", "synthetic", "--jobs", "5", "-p", "nosuch"], "unknown policy"),
        (["-w", "synthetic", "--jobs", "5", "--jitter", "-1"], "--jitter"),
        (["-w", "synthetic", "--jobs", "5", "--sweep-threshold", "0.2,x"], "comma-separated"),
        (
            ["-w", "synthetic", "--jobs", "5", "--sweep-threshold", "0.3", "--sweep-policy", "fgd"],
            "takes no threshold",
        ),
    ],
)
def test_simulate_explains_bad_input(tmp_path: Path, args: list[str], message: str) -> None:
    res = CliRunner().invoke(command, [*args, "--no-progress", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and message in res.output


def test_simulate_with_a_tenancy_file_reports_each_tenant_and_the_parameters(tmp_path: Path) -> None:
    out = tmp_path / "out"
    tenancy = Path(__file__).resolve().parents[2] / "examples" / "openb-tenancy.toml"
    res = CliRunner().invoke(command, [
        "-w", "synthetic", "--jobs", "80", "--load", "1.2", "--cluster", "A100-40GB:8", "--tenancy", str(tenancy),
        "-p", "paper-nomig", "--no-progress", "--out", str(out),
    ])
    assert res.exit_code == 0, res.output
    report = (out / "report.md").read_text()
    assert "## Tenants" in report
    assert "tenant-0" in report.split("## Tenants")[1]
    assert f"tenancy `{tenancy}`" in report


def test_simulate_with_a_tenancy_file_under_a_static_layout_says_why_it_cannot(tmp_path: Path) -> None:
    tenancy = Path(__file__).resolve().parents[2] / "examples" / "openb-tenancy.toml"
    res = CliRunner().invoke(command, [
        "-w", "synthetic", "--jobs", "20", "--cluster", "A100-40GB:8", "--tenancy", str(tenancy), "-p", "static",
        "--no-progress", "--out", str(tmp_path / "out"),
    ])
    assert res.exit_code == 1
    assert "tenancy runs need a policy that repartitions GPUs, not static" in res.output
    assert not (tmp_path / "out").exists()


def test_simulate_with_a_tenancy_file_runs_the_policies_named(tmp_path: Path) -> None:
    tenancy = Path(__file__).resolve().parents[2] / "examples" / "openb-tenancy.toml"
    out = tmp_path / "out"
    res = CliRunner().invoke(command, [
        "-w", "synthetic", "--jobs", "200", "--cluster", "A100-40GB:8", "--tenancy", str(tenancy),
        "--load", "1.2", "-p", "migsched", "-p", "migsched[reserve=off]", "-p", "first-fit", "--no-progress",
        "--out", str(out),
    ])
    assert res.exit_code == 0, res.output
    runs = json.loads((out / "kpis.json").read_text())
    assert [k["policy"] for k in runs] == ["migsched", "migsched[reserve=off]", "first-fit"]
    assert all(k["completed"] + k["rejected"] == k["jobs"] == 200 for k in runs)
    assert runs[1]["reserved_idle_gpu_h"] == 0
