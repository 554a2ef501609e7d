"""The Markdown report, the KPI JSON (the contract) and the time series JSON of a ``migsched simulate``
run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from shared.sim.classes import ClassKpis, class_order
from shared.sim.metrics import Kpis, RunResult

COLUMNS = (
    ("policy", "policy", "{}"),
    ("threshold", "t", "{:g}"),
    ("completed", "done", "{}"),
    ("rejection_rate", "rej", "{:.1%}"),
    ("rejection_rate_peak", "rej peak", "{:.1%}"),
    ("jct_mean_s", "JCT mean", "{:.0f}"),
    ("jct_p50_s", "p50", "{:.0f}"),
    ("jct_p95_s", "p95", "{:.0f}"),
    ("jct_p99_s", "p99", "{:.0f}"),
    ("wait_mean_s", "wait", "{:.0f}"),
    ("rejected_gpu_h", "rej GPU-h", "{:.0f}"),
    ("utilization", "util", "{:.1%}"),
    ("frag_rate_mean", "frag mean", "{:.1%}"),
    ("frag_rate_peak", "frag peak", "{:.1%}"),
    ("reconfigurations", "reconf", "{}"),
    ("migrations", "migr", "{}"),
    ("migrated_share", "migr share", "{:.1%}"),
    ("stretch_mean", "stretch", "{:.3f}"),
    ("jobs_per_day", "jobs/day", "{:.0f}"),
    ("events", "events", "{}"),
    ("wall_s", "wall s", "{:.1f}"),
)

PAPER = "seed article 000 (MIG scheduling with load balancing, dynamic partitioning and migration)"


class Section(msgspec.Struct, kw_only=True):
    title: str
    kind: str
    """compare | sweep | ablation"""
    runs: list[RunResult]
    command: str = ""
    prefix: str = ""


def kpi_table(kpis: Sequence[Kpis]) -> str:
    head = "| " + " | ".join(c[1] for c in COLUMNS) + " |"
    sep = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(COLUMNS))) + "|"
    rows = ["| " + " | ".join(fmt.format(getattr(k, f)) for f, _, fmt in COLUMNS) + " |" for k in kpis]
    return "\n".join([head, sep, *rows])


def class_table(kpis: Sequence[Kpis], cell: str = "rejected") -> str:
    """Per demand class and run: ``rejected`` (``rejected / jobs``: what the overall rate hides) or ``wait``
    (mean / p95 seconds of the placed jobs)."""
    names = sorted({c for k in kpis for c in k.classes}, key=class_order)
    if not names:
        return ""
    head = "| policy | " + " | ".join(names) + " |"
    sep = "|---|" + "---:|" * len(names)

    def show(c: ClassKpis) -> str:
        return f"{c.rejected} / {c.jobs}" if cell == "rejected" else f"{c.wait_mean_s:.0f} / {c.wait_p95_s:.0f}"

    rows = ["| " + k.policy + " | " + " | ".join(
        show(k.classes[n]) if n in k.classes else "" for n in names) + " |" for k in kpis]
    return "\n".join([head, sep, *rows])


def _plotter() -> Callable[..., list[Path]] | None:
    """``plots.all_plots``, or None without the ``[sim]`` extra (matplotlib): the tables are the result."""
    try:
        from shared.sim.plots import all_plots
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "matplotlib":
            return None
        raise
    return all_plots


def held_table(kpis: Sequence[Kpis]) -> str:
    """GPU-hours reservations held idle, as a share of the cluster's GPU-hours over the run, and the jobs
    refused on arrival because no set of nodes could host them."""
    rows = ["| policy | held idle GPU-h | share of cluster GPU-h | refused on arrival |", "|---|---:|---:|---|"]
    for k in kpis:
        total = k.gpus * k.makespan_s / 3600.0
        share = k.reserved_idle_gpu_h / total if total > 0 else 0.0
        refused = "; ".join(f"{n} ({why})" for why, n in k.refused.items()) or "none"
        rows.append(f"| {k.policy} | {k.reserved_idle_gpu_h:.0f} | {100 * share:.1f}% | {refused} |")
    return "\n".join(rows)


def _pick(kpis: Sequence[Kpis], *names: str) -> Kpis | None:
    for n in names:
        for k in kpis:
            if k.policy == n:
                return k
    return None


def _rel(new: float, old: float) -> float:
    return (new - old) / old if old else 0.0


def paper_rows(kpis: Sequence[Kpis]) -> list[tuple[str, str, str, str]]:
    """(claim, article, ours, how measured); empty when the runs lack paper or a baseline."""
    ours = _pick(kpis, "paper")
    base = _pick(kpis, "static", "lb-static", "first-fit")
    nomig = _pick(kpis, "paper-nomig")
    rows: list[tuple[str, str, str, str]] = []
    if ours is None:
        return rows
    if base is not None:
        rows.append(
            (
                "mean JCT",
                "-35 %",
                f"{_rel(ours.jct_mean_s, base.jct_mean_s):+.1%}",
                f"paper vs {base.policy}",
            )
        )
        rows.append(
            (
                "utilisation",
                "58 % -> 82 %",
                f"{base.utilization:.1%} -> {ours.utilization:.1%}",
                f"{base.policy} -> paper",
            )
        )
        rows.append(
            (
                "peak rejection",
                "15 % -> 3 %",
                f"{base.rejection_rate_peak:.1%} -> {ours.rejection_rate_peak:.1%}",
                f"{base.policy} -> paper, busiest 10 % of arrival windows",
            )
        )
        rows.append(
            (
                "jobs per day",
                "+42 %",
                f"{_rel(ours.jobs_per_day, base.jobs_per_day):+.1%}",
                f"paper vs {base.policy}",
            )
        )
    if nomig is not None:
        rows.append(
            (
                "fragmentation peak with migration",
                "-40 %",
                f"{_rel(ours.frag_rate_peak, nomig.frag_rate_peak):+.1%} (p95 "
                f"{_rel(ours.frag_rate_p95, nomig.frag_rate_p95):+.1%})",
                "paper vs paper-nomig",
            )
        )
    rows.append(
        (
            "fragmentation with periodic defrag",
            "< 15 %",
            f"mean {ours.frag_rate_mean:.1%}, p95 {ours.frag_rate_p95:.1%}",
            "paper, every 5 min",
        )
    )
    return rows


def paper_table(kpis: Sequence[Kpis]) -> str:
    rows = paper_rows(kpis)
    if not rows:
        return ""
    lines = ["| claim | article | ours | measured as |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def write(out: Path, sections: Sequence[Section], *, header: Sequence[str] = ()) -> list[Path]:
    """Write ``report.md``, ``kpis.json`` (all runs, one object each), ``series.json`` and the PNGs."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    all_kpis = [r.kpis for s in sections for r in s.runs]
    (out / "kpis.json").write_bytes(msgspec.json.format(msgspec.json.encode(all_kpis), indent=2) + b"\n")
    series = [
        {"policy": r.kpis.policy, "threshold": r.kpis.threshold, "section": s.title, "series": r.series}
        for s in sections
        for r in s.runs
    ]
    (out / "series.json").write_bytes(msgspec.json.encode(series))
    written += [out / "kpis.json", out / "series.json"]
    md = ["# Simulation report", "", *header, ""]
    plots = _plotter()
    if plots is None:
        md += ["PNG plots need matplotlib: `pip install 'migsched[sim]'`.", ""]
    for s in sections:
        pngs = plots(s.runs, out, prefix=s.prefix, sweep=s.kind == "sweep") if plots is not None else []
        written += pngs
        md += [f"## {s.title}", ""]
        if s.command:
            md += ["```", s.command, "```", ""]
        md += [kpi_table([r.kpis for r in s.runs]), ""]
        classes = class_table([r.kpis for r in s.runs])
        if classes:
            md += ["Rejected jobs per demand class:", "", classes, ""]
            md += ["Wait per demand class (mean / p95 s):", "", class_table([r.kpis for r in s.runs], "wait"), ""]
        held = [r.kpis for r in s.runs if r.kpis.reserved_idle_gpu_h > 0 or r.kpis.refused]
        if held:
            md += ["Reservations and refusals:", "", held_table(held), ""]
        if s.kind == "compare":
            table = paper_table([r.kpis for r in s.runs])
            if table:
                md += [f"Against the claims of the {PAPER}:", "", table, ""]
        md += [f"![{p.stem}]({p.name})" for p in pngs] + [""]
    md += [
        "Columns: JCT/wait in seconds; `rej peak` is the rejection rate among jobs arriving in the "
        "busiest 10 % "
        "of 100 equal arrival windows; `stretch` is run time over full-speed duration (interference and "
        "migration cost); see docs/simulator.md for every definition.",
        "",
    ]
    (out / "report.md").write_text("\n".join(md))
    written.append(out / "report.md")
    return written
