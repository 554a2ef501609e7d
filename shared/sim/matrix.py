"""The benchmark matrix: every policy over the openb traces at three cluster sizes (each as recorded and in two
replays with jittered arrivals), the synthetic mix at three loads and five seeds, and openb with DLRM background
load; one table of KPIs and, for each policy that is neither a baseline nor the bound, a verdict on the targets.

Cluster sizes are picked so that first-fit rejects about 1 %, 5-10 % and 15-25 % of the jobs of each trace.
A cell's *best baseline* is the baseline (``BASELINES``) with the fewest rejections in that cell; every cell is
judged on the mean over its seeds. ``fluid`` bounds what slice geometry costs (``fluid.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import msgspec
import numpy as np

from shared.mig.geometry import default_geometry
from shared.sim.classes import class_order
from shared.sim.cluster_spec import parse_cluster
from shared.sim.config import SimConfig
from shared.sim.jobs import Workload
from shared.sim.metrics import Kpis

BASELINES = ("first-fit", "best-fit", "fgd", "spread")
"""What users of a simple scheduler have: greedy backfill, no reservations, no migration."""
DEFAULT_POLICIES = (*BASELINES, "paper", "migsched", "migsched[reserve=off]", "fluid")
"""The rows of a matrix run: the baselines, the seeds' scheme, the default with and without reservations, and
the bound."""
REFERENCES = ("fluid",)
"""Rows that bound what placement could do, not policies to judge."""
MODEL = "A100-40GB"
OPENB_SIZES: dict[str, tuple[int, int, int]] = {
    "default": (44, 40, 36),
    "gpushare40": (44, 38, 34),
    "gpushare60": (42, 36, 32),
    "gpushare80": (42, 32, 28),
}
"""GPUs per openb variant where first-fit rejects ~1 %, 5-10 % and 15-25 % (``migsched simulate`` runs)."""
SYNTHETIC_LOADS = (0.8, 1.0, 1.2)
SYNTHETIC_GPUS = 64
SYNTHETIC_JOBS = 5000
SEEDS = (0, 1, 2, 3, 4)
OPENB_SEEDS = (0, 1, 2)
"""openb cells: the trace as recorded (seed 0) and replays with arrivals jittered by ``OPENB_JITTER_S``."""
OPENB_JITTER_S = 60.0
"""A saturated cluster is chaotic: reordering a few near-simultaneous arrivals moves one policy's rejection by
several points on the same trace (``spread`` on gpushare80 at 28 GPUs: 14.2 % as recorded, 14.3-19.8 % over
three jittered replays). One replay per trace would judge that noise."""
DLRM_CELL = ("default", 44, 8.0)
"""openb ``default`` on 44 GPUs with about 8 GPUs of DLRM inference beside it."""


class Cell(msgspec.Struct, frozen=True, kw_only=True):
    """One workload on one cluster; ``seed`` varies the synthetic draw, the DLRM sample and, with
    ``jitter_s``, a trace's arrivals."""

    workload: str
    gpus: int
    seed: int = 0
    load: float = 0.0
    dlrm_gpus: float = 0.0
    jitter_s: float = 0.0

    @property
    def group(self) -> str:
        """Cells that differ only by seed share a group (judged on their mean)."""
        base = f"{self.workload}@{self.gpus}"
        if self.load:
            base += f" load {self.load:g}"
        if self.dlrm_gpus:
            base += f" +dlrm {self.dlrm_gpus:g}"
        return base


class Run(msgspec.Struct, frozen=True, kw_only=True):
    cell: Cell
    label: str
    kpis: Kpis


def cells(quick: bool = False) -> list[Cell]:
    """The matrix; ``quick`` keeps one size per trace and one seed (for a smoke run)."""
    out: list[Cell] = []
    openb_seeds = OPENB_SEEDS[:1] if quick else OPENB_SEEDS
    for variant, sizes in OPENB_SIZES.items():
        for n in sizes[1:2] if quick else sizes:
            out.extend(_openb(f"openb:{variant}", n, 0.0, openb_seeds))
    for load in SYNTHETIC_LOADS[1:2] if quick else SYNTHETIC_LOADS:
        for seed in SEEDS[:1] if quick else SEEDS:
            out.append(Cell(workload="synthetic", gpus=SYNTHETIC_GPUS, seed=seed, load=load))
    variant, n, bg = DLRM_CELL
    out.extend(_openb(f"openb:{variant}", n, bg, openb_seeds))
    return out


def _openb(workload: str, gpus: int, dlrm_gpus: float, seeds: Sequence[int]) -> list[Cell]:
    return [Cell(workload=workload, gpus=gpus, seed=s, dlrm_gpus=dlrm_gpus, jitter_s=OPENB_JITTER_S if s else 0.0)
            for s in seeds]


def build_workload(cell: Cell, synthetic_jobs: int = SYNTHETIC_JOBS) -> Workload:
    from shared.sim.workloads.spec import WorkloadSpec, build

    geo = default_geometry()
    cluster = parse_cluster([f"{MODEL}:{cell.gpus}"], geo)
    name = "synthetic" if cell.workload == "synthetic" else f"openb:{cell.workload.partition(':')[2] or 'default'}"
    spec = WorkloadSpec(name=name, seed=cell.seed, jobs=synthetic_jobs, load=cell.load, dlrm_gpus=cell.dlrm_gpus,
                        jitter_s=cell.jitter_s)
    return build(spec, cluster, geo)


def run_cell(cell: Cell, labels: Sequence[str], cfg: SimConfig, synthetic_jobs: int = SYNTHETIC_JOBS) -> list[Run]:
    from shared.policy.placement.registry import parse_label
    from shared.sim.experiment import run_one

    geo = default_geometry()
    wl = build_workload(cell, synthetic_jobs)
    cluster = parse_cluster([f"{MODEL}:{cell.gpus}"], geo)
    c = msgspec.structs.replace(cfg, seed=cell.seed)
    out = []
    for label in labels:
        name, params = parse_label(label)
        k = run_one(wl, cluster, name, c, geometry=geo, params=params).kpis
        out.append(Run(cell=cell, label=label, kpis=msgspec.structs.replace(k, policy=label)))
    return out


def run_matrix(
    cell_list: Iterable[Cell], labels: Sequence[str], cfg: SimConfig, *, workers: int = 1,
    synthetic_jobs: int = SYNTHETIC_JOBS, progress: Callable[[Cell], None] | None = None,
) -> list[Run]:
    todo = list(cell_list)
    runs: list[Run] = []
    if workers <= 1:
        for cell in todo:
            runs.extend(run_cell(cell, labels, cfg, synthetic_jobs))
            if progress is not None:
                progress(cell)
        return runs
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futs = [pool.submit(run_cell, cell, labels, cfg, synthetic_jobs) for cell in todo]
        for cell, fut in zip(todo, futs, strict=True):
            runs.extend(fut.result())
            if progress is not None:
                progress(cell)
    return runs


# -- judging -----------------------------------------------------------------------------------------------

class Row(msgspec.Struct, frozen=True, kw_only=True):
    """One policy in one group of cells, averaged over the group's seeds."""

    group: str
    label: str
    seeds: int
    rejection: float
    rejection_sd: float
    rejected_gpu_h: float
    worst_class: str
    worst_class_rate: float
    wait_mean_s: float
    wait_p95_s: float
    jct_mean_s: float
    utilization: float
    migrated_share: float
    reconfigurations: float
    classes: dict[str, float]
    """Per demand class with at least ``MIN_CLASS_JOBS`` jobs: its rejection rate (mean over seeds)."""


MIN_CLASS_JOBS = 10


def rows(runs: Sequence[Run]) -> list[Row]:
    by: dict[tuple[str, str], list[Kpis]] = {}
    for r in runs:
        by.setdefault((r.cell.group, r.label), []).append(r.kpis)
    out = []
    for (group, label), ks in by.items():
        cls: dict[str, list[float]] = {}
        for k in ks:
            for name, c in k.classes.items():
                if c.jobs >= MIN_CLASS_JOBS:
                    cls.setdefault(name, []).append(c.rejection_rate)
        means = {n: float(np.mean(v)) for n, v in cls.items()}
        worst = max(means, key=lambda n: means[n], default="-")
        rej = np.array([k.rejection_rate for k in ks])
        out.append(Row(
            group=group, label=label, seeds=len(ks), rejection=float(rej.mean()), rejection_sd=float(rej.std()),
            rejected_gpu_h=float(np.mean([k.rejected_gpu_h for k in ks])), worst_class=worst,
            worst_class_rate=means.get(worst, 0.0), wait_mean_s=float(np.mean([k.wait_mean_s for k in ks])),
            wait_p95_s=float(np.mean([k.wait_p95_s for k in ks])),
            jct_mean_s=float(np.mean([k.jct_mean_s for k in ks])),
            utilization=float(np.mean([k.utilization for k in ks])),
            migrated_share=float(np.mean([k.migrated_share for k in ks])),
            reconfigurations=float(np.mean([k.reconfigurations for k in ks])), classes=means,
        ))
    return out


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """The targets of one candidate policy in one group of cells, against that group's best baseline."""

    group: str
    candidate: str
    best_baseline: str
    rejection: float
    best_rejection: float
    within: bool
    """Rejection at most the best baseline's + 0.1 point."""
    wait_ok: bool
    """Mean wait at most 10 % above the best baseline's."""
    fewer_15: bool
    """At least 15 % fewer rejections than the best baseline."""
    gap_closed: float | None
    """Share of the gap between the best baseline and ``fluid`` closed (None without a gap or a fluid run)."""
    no_starving: bool
    """Worst class (>= 10 jobs) rejects at most half the share of the worst class of the baseline whose worst
    class fares best: the baseline with the fewest rejections is not always the one that starves least."""
    gpu_h_ok: bool
    """Rejected GPU-hours at most every baseline's (the least any of them rejects), for the same reason."""
    migrated_ok: bool
    reconfig_ok: bool
    """Reconfigurations at most 10 % above first-fit's."""
    paired_sd: float | None = None
    """Standard deviation, over the group's runs, of the candidate's rejection minus the best baseline's in the
    same run (same seed, same replay): how far a replay moves the difference the targets judge. None without
    the runs or with one run."""


def verdicts(table: Sequence[Row], candidate: str = "migsched", runs: Sequence[Run] = ()) -> list[Verdict]:
    """Each group's verdict (``runs``, when given, add the paired spread of the rejection difference)."""
    by_run = {(r.cell.group, r.cell.seed, r.label): r.kpis.rejection_rate for r in runs}
    out = []
    groups = list(dict.fromkeys(r.group for r in table))
    for g in groups:
        here = {r.label: r for r in table if r.group == g}
        cand = here.get(candidate)
        bases = [here[b] for b in BASELINES if b in here]
        if cand is None or not bases:
            continue
        best = min(bases, key=lambda r: (r.rejection, r.wait_mean_s))
        worst_base = min(b.worst_class_rate for b in bases)
        fluid = here.get("fluid")
        gap = None
        if fluid is not None and best.rejection - fluid.rejection > 1e-9:
            gap = (best.rejection - cand.rejection) / (best.rejection - fluid.rejection)
        ff = here.get("first-fit")
        seeds = [seed for (grp, seed, label) in by_run if grp == g and label == candidate]
        diffs = [by_run[(g, s, candidate)] - by_run[(g, s, best.label)] for s in seeds if (g, s, best.label) in by_run]
        out.append(Verdict(
            group=g, candidate=candidate, best_baseline=best.label, rejection=cand.rejection,
            best_rejection=best.rejection, within=cand.rejection <= best.rejection + 0.001,
            wait_ok=cand.wait_mean_s <= 1.10 * best.wait_mean_s + 1e-9,
            fewer_15=cand.rejection <= 0.85 * best.rejection - 1e-12 if best.rejection > 0 else False,
            gap_closed=gap,
            no_starving=cand.worst_class_rate <= 0.5 * worst_base + 1e-12 if worst_base > 0
            else cand.worst_class_rate == 0.0,
            gpu_h_ok=cand.rejected_gpu_h <= min(b.rejected_gpu_h for b in bases) + 1e-9,
            migrated_ok=cand.migrated_share <= 0.02,
            reconfig_ok=ff is None or cand.reconfigurations <= 1.10 * ff.reconfigurations + 1e-9,
            paired_sd=float(np.std(diffs)) if len(diffs) > 1 else None,
        ))
    return out


def candidates(labels: Iterable[str]) -> list[str]:
    """The labels a matrix run judges against the targets, in the order given: every one that is neither a
    baseline nor a reference (``migsched``, ``paper``, a variant such as ``migsched[in_time=off]`` or
    ``first-fit[reserve=on]``)."""
    return [label for label in dict.fromkeys(labels) if label not in BASELINES and label not in REFERENCES]


def markdown(table: Sequence[Row], verdict: Sequence[Verdict], command: str = "") -> str:
    lines = ["# Benchmark matrix", ""]
    if command:
        lines += ["```", command, "```", ""]
    lines += [
        "| cell | policy | seeds | rej % | ± | rejected GPU-h | worst class | its rej % | wait mean s | wait p95 s "
        "| JCT mean s | util % | migrated % | reconf |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in table:
        lines.append(
            f"| {r.group} | {r.label} | {r.seeds} | {100 * r.rejection:.2f} | {100 * r.rejection_sd:.2f} | "
            f"{r.rejected_gpu_h:.0f} | {r.worst_class} | {100 * r.worst_class_rate:.1f} | {r.wait_mean_s:.0f} | "
            f"{r.wait_p95_s:.0f} | {r.jct_mean_s:.0f} | {100 * r.utilization:.1f} | {100 * r.migrated_share:.2f} | "
            f"{r.reconfigurations:.0f} |")
    lines += ["", "## Rejection by demand class (%)", ""]
    names = sorted({n for r in table for n in r.classes}, key=class_order)
    lines += ["| cell | policy | " + " | ".join(names) + " |", "|---|---|" + "---:|" * len(names)]
    for r in table:
        vals = " | ".join(f"{100 * r.classes[n]:.1f}" if n in r.classes else "" for n in names)
        lines.append(f"| {r.group} | {r.label} | {vals} |")
    for candidate in dict.fromkeys(v.candidate for v in verdict):
        lines += _targets([v for v in verdict if v.candidate == candidate])
    return "\n".join(lines) + "\n"


def _targets(verdict: Sequence[Verdict]) -> list[str]:
    """One candidate's verdict, cell by cell, and how many cells meet each target."""
    lines = ["", f"## Targets of `{verdict[0].candidate}` against the best baseline of each cell", "",
             "| cell | best baseline | its rej % | candidate rej % | difference, ± paired sd (pt) | ≤ +0.1 pt "
             "| wait ≤ +10 % | ≥ 15 % fewer | gap to fluid closed | no class starves | GPU-h ≤ | migrated ≤ 2 % "
             "| reconf ≤ +10 % |",
             "|---|---|---:|---:|---:|---|---|---|---:|---|---|---|---|"]
    for v in verdict:
        gap = f"{100 * v.gap_closed:.0f} %" if v.gap_closed is not None else "-"
        diff = f"{100 * (v.rejection - v.best_rejection):+.2f}"
        if v.paired_sd is not None:
            diff += f" ± {100 * v.paired_sd:.2f}"
        lines.append(
            f"| {v.group} | {v.best_baseline} | {100 * v.best_rejection:.2f} | {100 * v.rejection:.2f} | {diff} | "
            f"{_yn(v.within)} | {_yn(v.wait_ok)} | {_yn(v.fewer_15)} | {gap} | {_yn(v.no_starving)} | "
            f"{_yn(v.gpu_h_ok)} | {_yn(v.migrated_ok)} | {_yn(v.reconfig_ok)} |")
    n = len(verdict)
    lines += ["", f"Cells where `{verdict[0].candidate}` meets each target: "
              + ", ".join(f"{name} {sum(getattr(v, attr) for v in verdict)}/{n}" for name, attr in (
                  ("rejection", "within"), ("wait", "wait_ok"), ("15 % fewer", "fewer_15"),
                  ("no starving", "no_starving"), ("GPU-h", "gpu_h_ok"), ("migrated", "migrated_ok"),
                  ("reconfigurations", "reconfig_ok")))]
    return lines


def _yn(ok: bool) -> str:
    return "yes" if ok else "**no**"


def write(out: Path, runs: Sequence[Run], command: str = "") -> list[Path]:
    """``matrix.md`` (the KPIs, and a verdict for each of the run's ``candidates``), ``matrix.json`` and, with
    matplotlib, ``matrix.png``."""
    out.mkdir(parents=True, exist_ok=True)
    table = rows(runs)
    verdict = [v for c in candidates(r.label for r in runs) for v in verdicts(table, c, runs)]
    md = out / "matrix.md"
    md.write_text(markdown(table, verdict, command))
    js = out / "matrix.json"
    js.write_text(json.dumps({
        "runs": [msgspec.to_builtins(r) for r in runs],
        "rows": [msgspec.to_builtins(r) for r in table],
        "verdicts": [msgspec.to_builtins(v) for v in verdict],
    }, indent=1, sort_keys=True))
    written = [md, js]
    png = _plot(out / "matrix.png", table)
    if png is not None:
        written.append(png)
    return written


def _plot(path: Path, table: Sequence[Row]) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the [sim] extra is not installed: the table is the result
        return None
    groups = list(dict.fromkeys(r.group for r in table))
    labels = list(dict.fromkeys(r.label for r in table))
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(groups)), 4.5))
    width = 0.8 / max(1, len(labels))
    for k, label in enumerate(labels):
        ys = [next((100 * r.rejection for r in table if r.group == g and r.label == label), 0.0) for g in groups]
        ax.bar(np.arange(len(groups)) + k * width, ys, width, label=label)
    ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2)
    ax.set_xticklabels(groups, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("rejected jobs (%)")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
