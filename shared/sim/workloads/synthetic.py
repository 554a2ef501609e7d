"""A synthetic workload of four classes with Poisson arrivals at a chosen offered load.

Offered load rho = (arrival rate x mean compute slices x mean run time) / cluster compute slices, so rho = 1
asks for exactly the cluster's compute on average. Class parameters are defaults meant to look like a shared
inference + training cluster; change them through ``classes``.
"""

from __future__ import annotations

import msgspec
import numpy as np

from shared.policy.request import Demand
from shared.sim.errors import WorkloadError
from shared.sim.jobs import SimJob, Workload


class JobClass(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    share: float
    """Fraction of arrivals."""
    shapes: dict[str, float]
    """MIG shape (or ``Ngpu`` for N whole GPUs) -> probability."""
    mean_s: float
    """Mean run time (lognormal, sigma 1)."""
    priority: int
    latency_sensitive: bool = False
    patience_s: float | None = None


CLASSES: tuple[JobClass, ...] = (
    JobClass(
        name="inference",
        share=0.40,
        shapes={"1g": 0.5, "2g": 0.35, "3g": 0.15},
        mean_s=1800.0,
        priority=2,
        latency_sensitive=True,
    ),
    JobClass(
        name="small-training", share=0.30, shapes={"2g": 0.3, "3g": 0.4, "4g": 0.3}, mean_s=7200.0, priority=1
    ),
    JobClass(
        name="large-training",
        share=0.10,
        shapes={"7g": 0.6, "2gpu": 0.25, "4gpu": 0.1, "8gpu": 0.05},
        mean_s=21600.0,
        priority=1,
    ),
    JobClass(
        name="interactive",
        share=0.20,
        shapes={"1g": 0.6, "2g": 0.4},
        mean_s=1200.0,
        priority=2,
        patience_s=600.0,
    ),
)


GANG_CLASSES: tuple[JobClass, ...] = tuple(
    JobClass(
        name="large-training",
        share=0.15,
        shapes={"7g": 0.3, "2gpu": 0.12, "4gpu": 0.1, "8gpu": 0.08, "16gpu": 0.16, "32gpu": 0.12, "64gpu": 0.08,
                "128gpu": 0.04},
        mean_s=21600.0,
        priority=1,
    )
    if c.name == "large-training"
    else c
    for c in CLASSES
)
"""The multi-node-heavy mix: large training gains 16- to 128-GPU gangs (6 % of the jobs, most of the GPU-hours,
as in public traces of training clusters); the other classes as in ``CLASSES``."""

MIXES: dict[str, tuple[JobClass, ...]] = {"default": CLASSES, "gangs": GANG_CLASSES}
"""The named mixes ``-w synthetic[:MIX]`` takes."""


def _slices(shape: str) -> int:
    return 7 * int(shape[:-3]) if shape.endswith("gpu") else int(shape[0])


def synthetic(
    rng: np.random.Generator,
    *,
    jobs: int,
    load: float,
    cluster_slices: int,
    classes: tuple[JobClass, ...] = CLASSES,
    tenants: int = 8,
    mix: str = "default",
) -> Workload:
    """``jobs`` Poisson arrivals of ``classes`` at offered ``load``; ``mix`` only names the workload."""
    if jobs < 1:
        raise WorkloadError(f"a synthetic workload needs at least one job, got {jobs}")
    if load <= 0 or cluster_slices <= 0:
        raise WorkloadError(
            f"offered load and cluster size must be positive (load={load}, slices={cluster_slices})"
        )
    total = sum(c.share for c in classes)
    mean_work = sum(
        c.share / total * c.mean_s * sum(p * _slices(s) for s, p in c.shapes.items()) / sum(c.shapes.values())
        for c in classes
    )
    rate = load * cluster_slices / mean_work
    gaps = rng.exponential(1.0 / rate, size=jobs)
    arrivals = np.cumsum(gaps) - gaps[0]
    which = rng.choice(len(classes), size=jobs, p=[c.share / total for c in classes])
    # lognormal with sigma 1: mean = exp(mu + 1/2)
    u = rng.lognormal(mean=-0.5, sigma=1.0, size=jobs)
    tenant_w = np.array([1.0 / (k + 1) for k in range(tenants)])
    who = rng.choice(tenants, size=jobs, p=tenant_w / tenant_w.sum())
    picks: list[np.ndarray] = []
    for c in classes:
        names = list(c.shapes)
        w = np.array([c.shapes[s] for s in names], dtype=np.float64)
        picks.append(rng.choice(len(names), size=jobs, p=w / w.sum()))
    out: list[SimJob] = []
    for i in range(jobs):
        c = classes[int(which[i])]
        shape = list(c.shapes)[int(picks[int(which[i])][i])]
        if shape.endswith("gpu"):
            n = int(shape[:-3])
            demand, shape = Demand(kind="gpus", gpus=n) if n > 1 else Demand(kind="mig", profile="7g"), "7g"
        else:
            demand = Demand(kind="mig", profile=shape)
        dur = max(1.0, round(c.mean_s * float(u[i]), 3))
        out.append(
            SimJob(
                id=f"syn-{i:06d}",
                arrival=round(float(arrivals[i]), 3),
                duration=dur,
                demand=demand,
                shape=shape,
                tenant=f"tenant-{int(who[i])}",
                priority=c.priority,
                latency_sensitive=c.latency_sensitive,
                wclass=c.name,
                patience=c.patience_s,
            )
        )
    name = f"synthetic:{jobs}@{load:g}" if mix == "default" else f"synthetic:{mix}:{jobs}@{load:g}"
    return Workload(name=name, jobs=tuple(out))
