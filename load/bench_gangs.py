"""Gangs across nodes: the multi-node-heavy mix (``synthetic:gangs``), or a trace with gangs across nodes, under
each policy, with and without reservations; one markdown row per cluster size and policy, means over the seeds.

    .venv/bin/python load/bench_gangs.py --gpus 256 --gpus 512 --seed 1 --seed 2 --seed 3
    .venv/bin/python load/bench_gangs.py --policy migsched --reserve-slack 3600   # holds with an hour of slack
    .venv/bin/python load/bench_gangs.py -w itp:cluster04 --gpus 560 --gpus 672 --seed 0 --seed 1 --seed 2

``-w`` takes any workload ``migsched simulate`` does: ``itp:clusterNN`` (Microsoft's ITP traces, ``migsched
traces`` says where to get them) or ``csv:PATH`` with ``--csv-map``. A trace replays as recorded for seed 0;
any other seed shifts each arrival by up to ``--jitter`` seconds either way, drawn from the seed.

Columns: every job's rejection; the rejection of the *big* gangs (16 GPUs or more); their mean wait (over the
gangs that ran) and p95 wait (a rejected gang counted at its patience, so that turning a gang away never
shortens the tail); the mean wait of the *small* jobs (1g-4g MIG requests; in a workload without them, jobs of
one whole GPU); rejected GPU-hours; the share of
the cluster's GPU-hours that reservations held idle; utilisation. When the FIFO-with-reservations reference
(``first-fit[reserve=on]``) runs too, a second table gives each policy's big-gang rejection, big-gang p95 wait and
small-job wait minus the reference's, paired by seed (mean ± standard deviation over the seeds): whether a
difference holds in every workload or moves with the seed. A last table splits the big gangs by size: each size's
rejection and mean and p95 wait, means over the seeds (a pooled p95 is mostly the sizes there are most of). When
the reference or greedy backfill (``first-fit``) runs, a verdict closes the output: which of the targets each
policy meets (``load/gang_targets.py``).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import numpy.typing as npt

from load.gang_targets import GREEDY, REFERENCE, table, verdicts
from shared.mig.geometry import default_geometry
from shared.policy.placement.registry import get_policy, parse_label
from shared.sim.cluster import parse_cluster
from shared.sim.config import SimConfig
from shared.sim.engine import Simulator
from shared.sim.experiment import policy_params
from shared.sim.workloads.spec import WorkloadSpec, build

LABELS = ("migsched", "migsched[reserve=off]", "first-fit", "first-fit[reserve=on]", "best-fit", "fgd")
BIG = 16
SMALL = ("1g", "2g", "3g", "4g")
COLUMNS = ("rejected", "big rejected", "big wait mean h", "big wait p95 h", "small wait mean s", "rejected GPU-h",
           "held idle", "utilisation")
PAIRED = ("big rejected", "big wait p95 h", "small wait mean s")
SIZE_COLUMNS = ("rejected", "wait mean h", "wait p95 h")


class Source(NamedTuple):
    """Where a run's jobs come from: a synthetic mix (``jobs`` at ``load``, drawn from the seed), or a trace
    (``csv_map`` for ``csv:PATH``), replayed as recorded for seed 0 or with arrivals jittered by up to
    ``jitter_s``."""

    workload: str = "synthetic:gangs"
    jobs: int = 5000
    load: float = 0.9
    csv_map: str = ""
    jitter_s: float = 60.0

    def spec(self, seed: int) -> WorkloadSpec:
        if self.workload.startswith("synthetic"):
            return WorkloadSpec(name=self.workload, seed=seed, jobs=self.jobs, load=self.load)
        return WorkloadSpec(name=self.workload, csv_map=self.csv_map, seed=seed,
                            jitter_s=self.jitter_s if seed else 0.0)


class Figures(NamedTuple):
    """One run's figures: ``row`` in ``COLUMNS`` order; ``sizes``, per gang size of ``BIG`` GPUs or more, its
    figures in ``SIZE_COLUMNS`` order (waits as in ``COLUMNS``: the mean over the gangs that ran, the p95 with a
    rejected gang at its patience)."""

    row: list[float]
    sizes: dict[int, list[float]]


def paired(mine: list[list[float]], ref: list[list[float]]) -> dict[str, tuple[float, float]]:
    """Per figure of ``PAIRED``: the mean and the standard deviation over the seeds of ``mine`` minus ``ref``
    (each a run's figures in ``COLUMNS`` order, both in the same seed order)."""
    out = {}
    for name in PAIRED:
        k = COLUMNS.index(name)
        d = np.array([a[k] - b[k] for a, b in zip(mine, ref, strict=True)])
        out[name] = (float(d.mean()), float(d.std()))
    return out


def run(gpus: int, seed: int, label: str, source: Source, patience_s: float, slack_s: float = 0.0,
        hints: tuple[float, float] = (1.0, 0.0), max_held: int = 2) -> Figures:
    """One run's figures (``slack_s``: the reservations' slack, ``--reserve-slack``; ``hints``: the hint factor
    and the default hint of a job without one, ``--hint-factor`` and ``--default-hint``; ``max_held``: holds at
    once, ``--max-reservations``)."""
    geo = default_geometry()
    cluster = parse_cluster([f"A100-40GB:{gpus}"], geo)
    wl = build(source.spec(seed), cluster, geo)
    cfg = SimConfig(patience_s=patience_s, seed=seed, reserve_slack_s=slack_s, hint_factor=hints[0],
                    default_hint_s=hints[1], max_reservations=max_held)
    name, params = parse_label(label)
    spec, policy = get_policy(name, **{**policy_params(name, wl, cfg), **params})
    sim = Simulator(wl, cluster, spec, policy, cfg, geometry=geo)
    k = sim.run().kpis
    done, start = sim.out.completed, sim.out.start
    wait = np.array([start[i] - j.arrival if done[i] else patience_s for i, j in enumerate(wl.jobs)])
    ran = np.array(done, dtype=bool)
    size = np.array([j.demand.gpus if j.demand.kind == "gpus" else 0 for j in wl.jobs])
    big = size >= BIG
    small = np.array([j.demand.kind == "mig" and j.shape in SMALL for j in wl.jobs])
    if not small.any():  # a trace of whole GPUs: its one-GPU jobs (a full-size instance each)
        small = np.array([j.gpus == 1 and j.shape == "7g" for j in wl.jobs])
    cluster_gpu_h = gpus * k.makespan_s / 3600
    row = [
        k.rejection_rate, *_gangs(big, ran, wait), float(wait[small & ran].mean()) if (small & ran).any() else 0.0,
        k.rejected_gpu_h, (k.reserved_idle_gpu_h or 0.0) / cluster_gpu_h if cluster_gpu_h else 0.0, k.utilization,
    ]
    return Figures(row=row, sizes={int(n): _gangs(size == n, ran, wait) for n in np.unique(size[big])})


def _gangs(sel: npt.NDArray[np.bool_], ran: npt.NDArray[np.bool_], wait: npt.NDArray[np.float64]) -> list[float]:
    """The rejected share of the gangs ``sel`` picks, their mean wait in hours over those that ran, and their p95
    wait in hours (a rejected one at its patience)."""
    if not sel.any():
        return [0.0, 0.0, 0.0]
    return [float((sel & ~ran).sum() / sel.sum()),
            float(wait[sel & ran].mean() / 3600) if (sel & ran).any() else 0.0,
            float(np.percentile(wait[sel], 95) / 3600)]


def _run(args: tuple[int, int, str, Source, float, float, tuple[float, float], int]) -> Figures:
    return run(*args)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, action="append", help="cluster size (repeatable; default 256 and 512)")
    ap.add_argument("--seed", type=int, action="append", help="workload seed (repeatable; default 1, 2, 3)")
    ap.add_argument("--policy", action="append", help=f"policy label (repeatable; default {', '.join(LABELS)})")
    ap.add_argument("-w", "--workload", default="synthetic:gangs",
                    help="synthetic:gangs, a trace (itp:clusterNN) or csv:PATH with --csv-map")
    ap.add_argument("--jobs", type=int, default=5000, help="synthetic mix: how many jobs")
    ap.add_argument("--load", type=float, default=0.9, help="synthetic mix: offered load")
    ap.add_argument("--csv-map", default="", help="csv:PATH: what its columns mean (see migsched simulate)")
    ap.add_argument("--jitter", type=float, default=60.0,
                    help="trace: seconds each arrival may move either way in a replay of a seed other than 0")
    ap.add_argument("--patience", type=float, default=86400.0, help="seconds a job waits before it is rejected")
    ap.add_argument("--reserve-slack", type=float, default=0.0,
                    help="a job may take a held GPU if its hint ends at most this many seconds after the hold's start")
    ap.add_argument("--hint-factor", type=float, default=1.0,
                    help="each job's duration hint is its run time times this; 0 = jobs give no hints")
    ap.add_argument("--default-hint", type=float, default=0.0,
                    help="seconds a job without a hint is expected to run, for planning holds; 0 = unknown")
    ap.add_argument("--max-reservations", type=int, default=2,
                    help="holds at once for every policy that reserves (MIGSCHED_MAX_RESERVATIONS)")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    if a.reserve_slack < 0 or a.hint_factor < 0 or a.default_hint < 0:
        ap.error("--reserve-slack, --hint-factor and --default-hint must be >= 0")
    if a.max_reservations < 1:
        ap.error("--max-reservations must be >= 1")
    sizes, seeds, labels = a.gpus or [256, 512], a.seed or [1, 2, 3], a.policy or list(LABELS)
    source = Source(workload=a.workload, jobs=a.jobs, load=a.load, csv_map=a.csv_map, jitter_s=a.jitter)
    hints = (a.hint_factor, a.default_hint)
    tasks = [(g, s, label, source, a.patience, a.reserve_slack, hints, a.max_reservations) for g in sizes
             for label in labels for s in seeds]
    with ProcessPoolExecutor(a.workers) as ex:
        results = list(ex.map(_run, tasks))
    runs: dict[tuple[int, str], list[Figures]] = defaultdict(list)
    for (g, _s, label, *_), r in zip(tasks, results, strict=True):
        runs[(g, label)].append(r)
    _means(runs)
    if len(seeds) > 1 and any(label == REFERENCE for _, label in runs):
        _paired(runs)
    _by_size(runs)
    if any(label in (REFERENCE, GREEDY) for _, label in runs):
        print("\nAgainst the targets (load/gang_targets.py):\n")
        print("\n".join(table(verdicts({k: [f.row for f in v] for k, v in runs.items()}, COLUMNS))))


def _means(runs: dict[tuple[int, str], list[Figures]]) -> None:
    print("| GPUs | policy | " + " | ".join(COLUMNS) + " |")
    print("|---:|---|" + "---:|" * len(COLUMNS))
    for (g, label), v in runs.items():
        m = np.mean(np.array([f.row for f in v]), axis=0)
        print(f"| {g} | {label} | {100 * m[0]:.1f} % | {100 * m[1]:.1f} % | {m[2]:.1f} | {m[3]:.1f} | {m[4]:.0f} | "
              f"{m[5]:,.0f} | {100 * m[6]:.1f} % | {100 * m[7]:.1f} % |")


def _paired(runs: dict[tuple[int, str], list[Figures]]) -> None:
    print(f"\nAgainst `{REFERENCE}`, paired by seed (mean ± sd of the difference):\n")
    print("| GPUs | policy | big rejected, points | big wait p95, h | small wait mean, s |")
    print("|---:|---|---:|---:|---:|")
    for (g, label), v in runs.items():
        if label == REFERENCE:
            continue
        d = paired([f.row for f in v], [f.row for f in runs[(g, REFERENCE)]])
        (rej, rej_sd), (p95, p95_sd), (small, small_sd) = (d[n] for n in PAIRED)
        print(f"| {g} | {label} | {100 * rej:+.1f} ± {100 * rej_sd:.1f} | {p95:+.1f} ± {p95_sd:.1f} | "
              f"{small:+.0f} ± {small_sd:.0f} |")


def _by_size(runs: dict[tuple[int, str], list[Figures]]) -> None:
    sizes = sorted({n for v in runs.values() for f in v for n in f.sizes})
    if not sizes:
        return
    print("\nBig gangs by size (rejected, mean wait h / p95 wait h; means over the seeds):\n")
    print("| GPUs | policy | " + " | ".join(f"{n} GPUs" for n in sizes) + " |")
    print("|---:|---|" + "---:|" * len(sizes))
    for (g, label), v in runs.items():
        cells = []
        for n in sizes:
            got = [f.sizes[n] for f in v if n in f.sizes]
            if not got:
                cells.append("-")
                continue
            rej, mean_h, p95_h = np.mean(np.array(got), axis=0)
            cells.append(f"{100 * rej:.1f} %, {mean_h:.1f} / {p95_h:.1f}")
        print(f"| {g} | {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
