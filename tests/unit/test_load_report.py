"""Report rendering and updating, budgets as checks, scenarios' matching exits, RSS trends."""

from __future__ import annotations

from pathlib import Path

import pytest

from load.generator import GeneratorStats
from load.memory import MemorySampler, find_services, rss_kib, trend
from load.recorder import Recorder
from load.report import collect, render, update, verdict
from load.scenarios import SCENARIOS, Budget, scenario

pytestmark = pytest.mark.unit
MS = 1_000_000


class Clock:
    now = 0

    def __call__(self) -> int:
        return self.now


def a_run(title: str = "steady 100/s", command_ms: int = 7, lose: int = 0) -> object:
    rec = Recorder("r", final="running", clock=Clock())
    gen = GeneratorStats()
    for i in range(100):
        t = i * 10 * MS
        rec.submitted(f"r-{i}", t)
        gen.sent += 1
        gen.acked += 1
        gen.ack_latency_us.record_value(500)
        gen.send_lag_us.record_value(20)
        if i < 100 - lose:
            rec.observe("placed", f"r-{i}", t + 2 * MS)
            rec.observe("command", f"r-{i}", t + command_ms * MS)
            rec.observe("running", f"r-{i}", t + (command_ms + 1) * MS)
    s = collect(title=title, command="python -m load run --rate 100", started_at="2026-11-29 18:00 UTC",
                offered_rate=100.0, duration_s=1.0, gen=gen, rec=rec, stack="2 nodes × 8 GPUs")
    return s


def test_a_run_within_budget_passes_every_check_and_renders_its_figures() -> None:
    s = a_run()
    s.checks = verdict(s, Budget())
    assert [c.ok for c in s.checks] == [True, True, True]
    md = render(s)
    assert md.startswith("## steady 100/s\n")
    assert "`python -m load run --rate 100`" in md
    assert "| submit→command | 100 | 7.00 | 7.00 | 7.00 |" in md
    assert "| running | 100 | 0 | 0 |" in md
    assert "**FAIL**" not in md
    assert "| exit |" not in md  # not awaited in a run whose final stage is "running"


def test_slow_or_lossy_runs_fail_the_budget_with_the_deciding_figure() -> None:
    slow = a_run(command_ms=80)
    checks = {c.name: c for c in verdict(slow, Budget())}
    assert not checks["p99 submit→command ≤ 50 ms"].ok and "80" in checks["p99 submit→command ≤ 50 ms"].detail
    lossy = a_run(lose=3)
    checks = {c.name: c for c in verdict(lossy, Budget())}
    lost = checks["nothing lost"]
    assert not lost.ok and "not at running when the recorder stopped (lost or still queued): 3" in lost.detail
    lossy.checks = list(checks.values())
    assert "**FAIL**" in render(lossy)


def test_updating_the_report_replaces_a_scenarios_section_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "REPORT.md"
    update(path, render(a_run("first")))
    update(path, render(a_run("second")))
    update(path, render(a_run("first", command_ms=9)))
    text = path.read_text()
    assert text.startswith("# Load test report")
    assert text.count("## first") == 1 and text.count("## second") == 1
    assert text.index("## first") < text.index("## second")  # replaced in place
    assert "| submit→command | 100 | 9.01 |" in text and "| submit→command | 100 | 7.00 |" in text  # HDR


def test_a_steady_scenarios_exits_match_its_arrivals_at_the_target_fill() -> None:
    s = scenario("steady-1000-2x8")
    slices_busy = s.base_rate * s.duration_hint_s() * s.mean_slices()
    assert slices_busy == pytest.approx(s.fill * 2 * 8 * 7, rel=1e-3)  # Little's law
    assert s.jobs == 60_000 and "2 simulated executor node(s) × 8" in s.stack()
    assert {"steady-500-2x8", "steady-2000-64x8", "burst-64x8", "soak-1000-64x8"} <= set(SCENARIOS)
    assert len(list(scenario("burst-64x8").schedule(duration_s=3.2))) == round(
        scenario("burst-64x8").jobs * 0.1)


def test_memory_trend_ignores_the_warm_up_and_reports_drift() -> None:
    flat = [(float(t), 100_000 + (t % 3)) for t in range(0, 600, 5)]
    growing = [(float(t), 100_000 + 50 * t) for t in range(0, 600, 5)]
    assert abs(trend(flat, warmup_s=60).drift_pct) < 0.1
    g = trend(growing, warmup_s=60)
    assert g.drift_pct > 10 and g.samples == len([t for t, _ in growing if t >= 60])
    assert trend([(0.0, 1)], warmup_s=0) is None


def test_rss_is_read_from_proc_and_a_vanished_process_is_noted(tmp_path: Path) -> None:
    import os

    assert rss_kib(os.getpid()) > 0
    assert rss_kib(2**22 + 12345) is None
    sampler = MemorySampler({"me": os.getpid(), "ghost": 2**22 + 12345})
    sampler.sample(0.0)
    assert list(sampler.samples) == ["me"] and sampler.gone == {"ghost"}
    fake = tmp_path / "proc"
    for pid, argv in ((11, b"python\0-m\0services.balancer\0"), (12, b"migsched\0service\0registry\0"),
                      (13, b"python\0-m\0pytest\0")):
        (fake / str(pid)).mkdir(parents=True)
        (fake / str(pid) / "cmdline").write_bytes(argv)
    assert find_services(fake) == {"balancer": 11, "registry": 12}


def test_a_burst_is_judged_by_how_fast_its_backlog_drains_not_by_its_p99() -> None:
    s = a_run(command_ms=80)
    checks = {c.name: c for c in verdict(s, scenario("burst-64x8").budget)}
    assert set(checks) == {"nothing lost", "backlog drained within 10 s"}
    drained = checks["backlog drained within 10 s"]
    assert drained.ok and "0.08 s" in drained.detail


def test_the_cli_lists_scenarios_and_refuses_unknown_ones(capsys: pytest.CaptureFixture[str]) -> None:
    from load.__main__ import main

    assert main(["--no-uvloop", "scenarios"]) == 0
    assert "steady-2000-64x8" in capsys.readouterr().out
    assert main(["--no-uvloop", "scenario", "no-such-thing", "--nats", "nats://127.0.0.1:1"]) == 2
    assert "no scenario 'no-such-thing'" in capsys.readouterr().err


def test_rss_drift_is_judged_over_the_soak_only() -> None:
    from load.memory import MemoryTrend

    s = a_run()
    s.memory = {"executor": MemoryTrend(samples=30, first_mib=100.0, last_mib=140.0, max_mib=140.0, drift_pct=40.0)}
    soak = {c.name: c for c in verdict(s, scenario("soak-1000-64x8").budget)}
    assert not soak["RSS flat (±10 %)"].ok and "+40.0 % (executor)" in soak["RSS flat (±10 %)"].detail
    steady = [c.name for c in verdict(s, scenario("steady-1000-64x8").budget)]
    assert steady == ["nothing lost", "p99 submit→command ≤ 50 ms", "rate sustained"]
    assert not any("RSS" in c.name for c in verdict(s, scenario("burst-64x8").budget))
