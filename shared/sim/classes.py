"""Demand classes: the class each job is judged in (``1g`` ... ``7g``, ``<n>gpu``, ``shared``), what it asks
in whole GPUs, and each class's rejections and waits in a run (what an overall rate hides)."""

from __future__ import annotations

import msgspec
import numpy as np

from shared.sim.jobs import SimJob
from shared.sim.stats import pct, rounded


class ClassKpis(msgspec.Struct, frozen=True, kw_only=True):
    """One demand class of a run (``demand_class``): how many asked, how many were turned away, how long the
    placed ones waited."""

    jobs: int
    rejected: int
    rejection_rate: float
    wait_mean_s: float
    wait_p95_s: float
    rejected_gpu_h: float
    """GPU-hours (of 7 compute slices) the rejected jobs of the class asked for."""


def demand_class(job: SimJob) -> str:
    """The class a job is judged in: its MIG shape (``1g`` ... ``7g``), ``<n>gpu`` for ``n`` whole GPUs, or
    ``shared``."""
    kind = job.demand.kind
    if kind == "gpus":
        return f"{job.demand.gpus}gpu"
    if kind == "shared":
        return "shared"
    return job.shape


def gpu_equivalents(job: SimJob) -> float:
    """What a job asks of the cluster in whole GPUs of 7 compute slices (a ``3g`` is 3/7, four GPUs are 4)."""
    if job.demand.kind == "gpus":
        return float(job.demand.gpus)
    return (int(job.shape[0]) if job.shape[:1].isdigit() else 7) / 7.0


def class_gpus(name: str) -> int:
    """The whole GPUs a ``<n>gpu`` class (``demand_class``) asks for of each job; 0 for any other class."""
    return int(name[:-3]) if name.endswith("gpu") and name[:-3].isdigit() else 0


def class_order(name: str) -> tuple[int, int, str]:
    """MIG shapes first by size, then whole-GPU classes by GPU count, then the rest."""
    digits = "".join(c for c in name if c.isdigit())
    size = int(digits) if digits else 0
    if name.endswith("gpu"):
        return (1, size, name)
    return (0 if name[:1].isdigit() else 2, size, name)


def class_kpis(
    jobs: tuple[SimJob, ...], done: np.ndarray, wait: np.ndarray, work_s: np.ndarray
) -> dict[str, ClassKpis]:
    """Per demand class: ``done`` says which jobs completed, ``wait`` their start minus arrival, ``work_s``
    what each asked for in GPU-seconds."""
    by: dict[str, list[int]] = {}
    for i, j in enumerate(jobs):
        by.setdefault(demand_class(j), []).append(i)
    out: dict[str, ClassKpis] = {}
    for name in sorted(by, key=class_order):
        idx = np.array(by[name], dtype=np.intp)
        ok = done[idx]
        w = wait[idx][ok]
        rej = int((~ok).sum())
        out[name] = ClassKpis(
            jobs=int(idx.size), rejected=rej, rejection_rate=rounded(rej / idx.size),
            wait_mean_s=rounded(w.mean() if w.size else 0.0), wait_p95_s=rounded(pct(w, 95)),
            rejected_gpu_h=rounded(float(work_s[idx][~ok].sum()) / 3600.0),
        )
    return out
