"""PNG plots of one or more runs (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from shared.sim.metrics import RunResult

BARS = (
    ("jct_mean_s", "mean JCT (h)", 1 / 3600),
    ("wait_mean_s", "mean wait (min)", 1 / 60),
    ("utilization", "utilisation", 1.0),
    ("rejection_rate", "rejection rate", 1.0),
    ("rejection_rate_peak", "peak rejection", 1.0),
    ("frag_rate_mean", "frag rate (mean)", 1.0),
    ("frag_rate_peak", "frag rate (peak)", 1.0),
    ("reconfigurations", "reconfigurations", 1.0),
    ("migrations", "migrations", 1.0),
)


def label(r: RunResult, sweep: bool = False) -> str:
    return f"{r.kpis.policy} t={r.kpis.threshold:g}" if sweep else r.kpis.policy


def _smooth(ys: Sequence[float], k: int) -> list[float]:
    """A trailing mean over k samples, so several policies stay readable on one axis."""
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= k:
            acc -= ys[i - k]
        out.append(acc / min(i + 1, k))
    return out


def over_time(runs: Sequence[RunResult], field: str, title: str, path: Path, sweep: bool = False) -> Path:
    fig, ax = plt.subplots(figsize=(10, 4.2))
    for r in runs:
        s = r.series
        ys = s.utilization if field == "utilization" else s.frag_rate
        k = max(1, len(ys) // 100)
        ax.plot([t / 86400 for t in s.t], _smooth(ys, k), label=label(r, sweep), linewidth=1.1)
    ax.set_xlabel("days since the first arrival")
    ax.set_ylabel(title)
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=3)
    ax.set_title(f"{title} over time ({runs[0].kpis.workload}, {runs[0].kpis.cluster})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def jct_cdf(runs: Sequence[RunResult], path: Path, sweep: bool = False) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in runs:
        xs = [max(x, 1.0) for x in r.jct]
        if not xs:
            continue
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=label(r, sweep), linewidth=1.1)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s, log)")
    ax.set_ylabel("fraction of completed jobs")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title("JCT CDF")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def kpi_bars(runs: Sequence[RunResult], path: Path, sweep: bool = False) -> Path:
    fig, axes = plt.subplots(3, 3, figsize=(12, 8.5))
    names = [label(r, sweep) for r in runs]
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for ax, (field, title, scale) in zip(axes.flat, BARS, strict=True):
        vals = [getattr(r.kpis, field) * scale for r in runs]
        ax.bar(range(len(runs)), vals, color=colors)
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(len(runs)))
        ax.set_xticklabels(names, rotation=40, ha="right", fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"KPIs ({runs[0].kpis.workload}, {runs[0].kpis.cluster})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sweep_curve(runs: Sequence[RunResult], path: Path) -> Path:
    ts = [r.kpis.threshold for r in runs]
    fig, ax1 = plt.subplots(figsize=(7, 4.2))
    ax1.plot(ts, [r.kpis.jct_mean_s / 3600 for r in runs], "o-", color="C0", label="mean JCT (h)")
    ax1.set_xlabel("load threshold t")
    ax1.set_ylabel("mean JCT (h)", color="C0")
    ax2 = ax1.twinx()
    ax2.plot(ts, [r.kpis.utilization for r in runs], "s--", color="C1", label="utilisation")
    ax2.plot(
        ts,
        [r.kpis.stretch_mean - 1 for r in runs],
        "^:",
        color="C2",
        label="run-time stretch - 1 (interference + moves)",
    )
    ax2.plot(ts, [r.kpis.frag_rate_mean for r in runs], "v-.", color="C3", label="frag rate (mean)")
    ax2.set_ylim(0, 1)
    fig.legend(fontsize=8, loc="upper center", ncol=4)
    ax1.grid(alpha=0.3)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def all_plots(runs: Sequence[RunResult], out: Path, prefix: str = "", sweep: bool = False) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        over_time(runs, "utilization", "utilisation", out / f"{prefix}utilization.png", sweep),
        over_time(runs, "frag_rate", "fragmentation rate", out / f"{prefix}fragmentation.png", sweep),
        jct_cdf(runs, out / f"{prefix}jct_cdf.png", sweep),
        kpi_bars(runs, out / f"{prefix}kpi_bars.png", sweep),
    ]
    if sweep and len(runs) > 1:
        paths.append(sweep_curve(runs, out / f"{prefix}threshold_sweep.png"))
    return paths
