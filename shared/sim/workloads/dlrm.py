"""Loader for the Alibaba cluster-trace-gpu-v2025 DLRM inference instances, used as background load.

Only HN (GPU-node) instances are kept: each takes one whole GPU (the full profile, ``7g``), is
latency-sensitive
and high priority, and is tenant ``app_name``. Instances alive at the trace start (no creation time) arrive at
t = 0; those alive at its end (no deletion time) are censored at the trace end. The trace keeps ~3,200 GPUs
busy,
so ``gpus`` scales it down: each instance is kept with probability gpus / (mean alive), drawn from the seeded
generator handed in.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

from shared.policy.request import Demand
from shared.sim.errors import WorkloadError
from shared.sim.jobs import SimJob, Workload, sort_jobs
from shared.sim.workloads import catalog

COLUMNS = (
    "instance_sn",
    "role",
    "app_name",
    "gpu_request",
    "creation_time",
    "scheduled_time",
    "deletion_time",
)
MEAN_ALIVE = 3200.0
PRIORITY = 3


def default_path() -> Path:
    return catalog.traces_dir() / catalog.trace("dlrm").folder / catalog.trace("dlrm").pattern


def load_dlrm(
    rng: random.Random,
    *,
    gpus: float,
    path: str | Path | None = None,
    offset: float = 0.0,
    horizon: float | None = None,
) -> Workload:
    """About ``gpus`` whole GPUs of DLRM background load, arrivals shifted by ``offset`` and cut at
    ``horizon`` seconds of trace time (None = the whole trace)."""
    p = Path(path) if path is not None else default_path()
    if gpus <= 0:
        raise WorkloadError(f"DLRM background needs a positive GPU count, got {gpus}")
    try:
        with p.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise WorkloadError(f"{p.name} lacks column(s) {', '.join(missing)}")
            rows = [r for r in reader if r["role"] == "HN"]
    except OSError as exc:
        raise WorkloadError(f"cannot read DLRM trace {p}: {exc.strerror}; {catalog.missing_hint('dlrm')}") from None
    end = max(float(r["deletion_time"] or r["creation_time"] or 0) for r in rows)
    if horizon is not None:
        end = min(end, horizon)
    keep = min(1.0, gpus / MEAN_ALIVE)
    jobs: list[SimJob] = []
    for r in rows:
        if rng.random() >= keep:
            continue
        created = float(r["creation_time"]) if r["creation_time"] else 0.0
        if created >= end:
            continue
        started = float(r["scheduled_time"]) if r["scheduled_time"] else created
        deleted = min(float(r["deletion_time"]) if r["deletion_time"] else end, end)
        run = deleted - started
        if run <= 0:
            continue
        jobs.append(
            SimJob(
                id=f"dlrm-{r['instance_sn']}",
                arrival=offset + created,
                duration=run,
                demand=Demand(kind="mig", profile="7g"),
                shape="7g",
                tenant=r["app_name"],
                priority=PRIORITY,
                latency_sensitive=True,
                wclass="inference",
            )
        )
    if not jobs:
        raise WorkloadError(f"DLRM sample of {gpus} GPUs kept no instance; ask for more")
    return Workload(
        name=f"dlrm:{gpus:g}",
        jobs=sort_jobs(jobs),
        notes=(f"DLRM background: {len(jobs)} HN instances sampled for ~{gpus:g} GPUs",),
    )
