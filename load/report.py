"""One load run as data (``RunSummary``, also written as JSON) and as a Markdown section of a report (``--report``).

A section is keyed by its heading: re-running a scenario replaces its section and leaves the others alone, so
the report always holds the latest figure of each scenario together with the exact command that produced it.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from load.generator import GeneratorStats
from load.memory import MemoryTrend
from load.recorder import STAGES, LatencySummary, Recorder, summarize
from load.scenarios import Budget


class Check(msgspec.Struct, frozen=True):
    name: str
    ok: bool
    detail: str


class RunSummary(msgspec.Struct, kw_only=True):
    title: str
    command: str
    started_at: str
    stack: str = ""
    offered_rate: float
    duration_s: float
    submitted: int
    acked: int
    ack_errors: dict[str, int] = {}
    unacked: int = 0
    reached: dict[str, int]
    lost: dict[str, int]
    duplicates: dict[str, int] = {}
    reordered: int = 0
    errors: dict[str, int] = {}
    exit_kinds: dict[str, int] = {}
    throughput: dict[str, tuple[float, int]] = {}
    latency_ms: dict[str, LatencySummary]
    send_lag_ms: LatencySummary
    ack_ms: LatencySummary
    memory: dict[str, MemoryTrend | None] = {}
    final: str = "exit"
    skipped: list[str] = []
    """Stages the recorder did not watch (``--skip``): no figures for their spans."""
    cpus: int = 0
    loadavg: tuple[float, float] = (0.0, 0.0)
    """1-minute load average at the start and the end: on a shared 2-core machine, context for each figure."""
    harness_cpu_us_per_job: float = 0.0
    """CPU time of the generator + recorder process per job (what the harness takes from the stack)."""
    checks: list[Check] = []
    notes: list[str] = []


def collect(*, title: str, command: str, started_at: str, offered_rate: float, duration_s: float,
            gen: GeneratorStats, rec: Recorder, stack: str = "",
            memory: dict[str, MemoryTrend | None] | None = None) -> RunSummary:
    return RunSummary(
        title=title, command=command, started_at=started_at, stack=stack, offered_rate=offered_rate,
        duration_s=round(duration_s, 2), submitted=gen.sent, acked=gen.acked, ack_errors=dict(gen.ack_errors),
        unacked=gen.unacked, reached={s: rec.reached[s] for s in STAGES}, lost=rec.lost(),
        duplicates=dict(rec.duplicates), reordered=rec.reordered, errors=dict(rec.errors),
        exit_kinds=dict(rec.exit_kinds), throughput=rec.throughput(), latency_ms=rec.latencies(),
        send_lag_ms=summarize(gen.send_lag_us), ack_ms=summarize(gen.ack_latency_us), memory=memory or {},
        final=rec.final, skipped=[st for st in STAGES if st in rec.skip])


def verdict(s: RunSummary, budget: Budget) -> list[Check]:
    """The live-stack budgets, each as a check with the figure that decided it."""
    cmd = s.latency_ms.get("submit→command")
    measured = cmd is not None and cmd.count > 0
    rate = s.throughput.get("command", (0.0, 0))[0]
    checks = [
        Check("nothing lost", s.unacked == 0 and not s.ack_errors and s.lost.get(s.final, 1) == 0,
              f"{s.submitted} submitted, {s.acked} acked, not at {s.final} when the recorder stopped "
              f"(lost or still queued): {s.lost.get(s.final)}")]
    if budget.p99_submit_to_command_ms is not None:
        checks.append(Check(f"p99 submit→command ≤ {budget.p99_submit_to_command_ms:g} ms",
                            measured and cmd.p99 <= budget.p99_submit_to_command_ms,  # type: ignore[union-attr]
                            f"p99 {cmd.p99 if cmd else '-'} ms over {cmd.count if cmd else 0} jobs"))
    if budget.min_rate_share is not None:
        checks.append(Check("rate sustained", rate >= budget.min_rate_share * s.offered_rate,
                            f"commands {rate}/s for {s.offered_rate:g}/s offered"))
    if budget.max_wait_s is not None:
        wait_s = cmd.max / 1000 if cmd else 0.0
        checks.append(Check(f"backlog drained within {budget.max_wait_s:g} s",
                            measured and wait_s <= budget.max_wait_s, f"worst submit→command {wait_s:.2f} s"))
    trends = {k: v for k, v in s.memory.items() if v is not None}
    if trends and budget.max_rss_drift_pct is not None:
        worst = max(trends.items(), key=lambda kv: abs(kv[1].drift_pct))
        checks.append(Check(f"RSS flat (±{budget.max_rss_drift_pct:g} %)",
                            abs(worst[1].drift_pct) <= budget.max_rss_drift_pct,
                            f"largest drift {worst[1].drift_pct:+.1f} % ({worst[0]})"))
    return checks


def _fmt(x: float) -> str:
    return f"{x:,.1f}" if x >= 100 else f"{x:.2f}"


def render(s: RunSummary) -> str:
    """The Markdown section of one run."""
    out = [f"## {s.title}", "", f"- command: `{s.command}`", f"- run at {s.started_at}, {s.duration_s} s"]
    if s.stack:
        out.append(f"- stack: {s.stack}")
    if s.cpus:
        out.append(f"- machine: {s.cpus} CPUs, load average {s.loadavg[0]:.1f} at the start, "
                   f"{s.loadavg[1]:.1f} at the end; harness CPU {s.harness_cpu_us_per_job:.0f} µs "
                   "per job")
    if s.skipped:
        out.append(f"- stages not watched (harness CPU spared): {', '.join(s.skipped)}")
    out.append(f"- offered {s.offered_rate:g} arrivals/s; {s.submitted} submitted, {s.acked} acknowledged by "
               f"JetStream, {s.unacked} unacknowledged")
    if s.checks:
        out += ["", "| budget | result | figure |", "|---|---|---|"]
        out += [f"| {c.name} | {'pass' if c.ok else '**FAIL**'} | {c.detail} |" for c in s.checks]
    out += ["", "| latency (ms) | jobs | p50 | p90 | p99 | p99.9 | max |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    rows = [*s.latency_ms.items(), ("submit→JetStream ack", s.ack_ms), ("generator send lag", s.send_lag_ms)]
    for name, lat in rows:
        out.append(f"| {name} | {lat.count} | {_fmt(lat.p50)} | {_fmt(lat.p90)} | {_fmt(lat.p99)} "
                   f"| {_fmt(lat.p999)} | {_fmt(lat.max)} |")
    out += ["", "| stage | reached | lost | duplicates | mean/s | peak/s |", "|---|---:|---:|---:|---:|---:|"]
    sub_rate = s.throughput.get("submit", (0.0, 0))
    out.append(f"| submit | {s.submitted} | 0 | 0 | {sub_rate[0]:g} | {sub_rate[1]} |")
    for stage, n in s.reached.items():
        if STAGES.index(stage) > STAGES.index(s.final) or stage not in s.lost:
            continue  # not awaited in this run (no exits when jobs run longer than the run; a skipped stage)
        mean, peak = s.throughput.get(stage, (0.0, 0))
        out.append(f"| {stage} | {n} | {s.lost.get(stage, 0)} | {s.duplicates.get(stage, 0)} | {mean:g} "
                   f"| {peak} |")
    problems = {**{f"publish: {k}": v for k, v in s.ack_errors.items()}, **s.errors}
    if problems or s.reordered:
        out += ["", "Errors: " + (", ".join(f"{k} × {v}" for k, v in sorted(problems.items())) or "none")
                + (f"; {s.reordered} hops observed out of order" if s.reordered else "")]
    if s.exit_kinds:
        out += ["", "Exits: " + ", ".join(f"{k} × {v}" for k, v in sorted(s.exit_kinds.items()))]
    if s.memory:
        out += ["", "| process | RSS first (MiB) | last | max | drift |", "|---|---:|---:|---:|---:|"]
        for name, t in sorted(s.memory.items()):
            out.append(f"| {name} | no samples | | | |" if t is None else
                       f"| {name} | {t.first_mib} | {t.last_mib} | {t.max_mib} | {t.drift_pct:+.1f} % |")
    if s.notes:
        out += ["", *(f"- {n}" for n in s.notes)]
    return "\n".join(out).rstrip() + "\n"


HEADER = ("# Load test report\n\nProduced by `python -m load` (see `load/__main__.py`); each section is the "
          "latest run of one scenario. Latencies start at each job's *intended* send instant (open loop, "
          "coordinated-omission safe).\n")


def update(path: Path, section: str) -> None:
    """Replace the section with the same ``## `` heading in ``path``, or append it."""
    text = path.read_text(encoding="utf-8") if path.exists() else HEADER
    heading = section.splitlines()[0]
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n", encoding="utf-8")
