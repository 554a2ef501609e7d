"""The gang benchmark's targets as a verdict: for each cluster size and policy, which target its runs meet.

The targets for the big gangs (``load.bench_gangs.BIG``, 16 GPUs or more), each judged on the means over the seeds
unless said:

- **big rejected, no worse than the reference** (``first-fit[reserve=on]``, FIFO with reservations): the paired
  difference, seed by seed, is at most the matrix's 0.1 point, or not above twice its standard error over the
  seeds (so that a difference the seeds' noise explains does not read as a loss; with one seed, strictly);
- **big p95 wait, no worse than the reference**: the paired difference at most twice its standard error (with
  one seed, at most 0);
- **far fewer rejected than greedy backfill** (``first-fit``, the reference with its holds off): at most half
  greedy backfill's share, or none when it rejects none;
- **a shorter big p95 wait than greedy backfill**;
- **small jobs wait at most 10 % longer than under greedy backfill**;
- **reservations hold under 5 % of the cluster's GPU-hours idle**.

A target whose reference is not in the run reads ``None`` (printed ``-``). Pure: figures in, verdicts out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

REFERENCE = "first-fit[reserve=on]"
"""The FIFO-with-reservations reference (Slurm-style EASY backfill)."""
GREEDY = "first-fit"
"""Greedy backfill without reservations: the reference's placement with its holds off."""
REJECTION_TOLERANCE = 0.001
"""A rejected share at most this far above the reference's is no worse (the matrix's 0.1 point)."""
SMALL_RISE = 0.10
HELD_IDLE_MAX = 0.05
TARGETS = (
    "big rejected ≤ reference",
    "big p95 ≤ reference",
    "big rejected ≤ half of greedy's",
    "big p95 < greedy's",
    "small wait ≤ greedy's + 10 %",
    "held idle < 5 %",
)


class Verdict(NamedTuple):
    gpus: int
    label: str
    met: tuple[bool | None, ...]
    """Per target of ``TARGETS``: met, missed, or None when its reference is not in the run."""


def verdicts(runs: Mapping[tuple[int, str], Sequence[Sequence[float]]], columns: Sequence[str],
             ) -> list[Verdict]:
    """Every (size, policy) of ``runs`` but greedy backfill's own, judged against the targets. ``runs``: per
    (GPUs, label), one row of figures per seed in ``columns`` order (the same seed order for every label)."""
    at = [columns.index(name) for name in ("big rejected", "big wait p95 h", "small wait mean s", "held idle")]
    out = []
    for (gpus, label), rows in runs.items():
        if label == GREEDY:
            continue
        rej, p95, small, idle = np.asarray(rows, dtype=float)[:, at].T
        ref = _rows(runs, gpus, REFERENCE) if label != REFERENCE else None
        greedy = _rows(runs, gpus, GREEDY)
        met: list[bool | None] = [None, None, None, None, None]
        if ref is not None:
            met[0] = _no_worse(rej - ref[:, at[0]], REJECTION_TOLERANCE)
            met[1] = _no_worse(p95 - ref[:, at[1]], 0.0)
        if greedy is not None:
            g_rej = float(greedy[:, at[0]].mean())
            met[2] = float(rej.mean()) <= g_rej / 2 if g_rej > 0 else float(rej.mean()) == 0.0
            met[3] = float(p95.mean()) < float(greedy[:, at[1]].mean())
            met[4] = float(small.mean()) <= (1 + SMALL_RISE) * float(greedy[:, at[2]].mean())
        out.append(Verdict(gpus=gpus, label=label, met=(*met, float(idle.mean()) < HELD_IDLE_MAX)))
    return out


def _rows(runs: Mapping[tuple[int, str], Sequence[Sequence[float]]], gpus: int, label: str,
          ) -> np.ndarray | None:
    rows = runs.get((gpus, label))
    return None if rows is None else np.asarray(rows, dtype=float)


def _no_worse(diff: np.ndarray, tolerance: float) -> bool:
    """Whether paired differences (mine minus the reference's, per seed) show no loss: a mean within
    ``tolerance``, or not above twice its standard error over the seeds."""
    mean = float(diff.mean())
    if mean <= tolerance:
        return True
    if len(diff) < 2:
        return False
    return mean <= 2 * float(diff.std(ddof=1)) / math.sqrt(len(diff))


def table(found: Sequence[Verdict]) -> list[str]:
    """The verdicts as markdown lines: ``yes``, ``**no**`` or ``-`` (no reference in the run)."""
    lines = ["| GPUs | policy | " + " | ".join(TARGETS) + " |", "|---:|---|" + "---|" * len(TARGETS)]
    for v in found:
        cells = ("-" if m is None else "yes" if m else "**no**" for m in v.met)
        lines.append(f"| {v.gpus} | {v.label} | " + " | ".join(cells) + " |")
    return lines
