"""Replaying a workload into the live stack: load a trace, scale its clock, publish each arrival on time.

The live stack runs on wall time, so a replay at speed-up ``S`` divides every time of the trace by ``S``
before it leaves here: arrivals are published ``(arrival - t0) / S`` after the start, a job's
``duration_hint_s`` (what
the
sim executor runs it for) is ``duration / S``, and its patience ``patience / S``. Outcomes read back from the
stack are multiplied by ``S`` again (``livekpis``), so they compare with the simulator's virtual-time KPIs.

A replay onto GPUs in MIG mode compares the live stack with the simulator over MIG instances and whole GPUs,
gangs across nodes included (their members on full-size instances); time-sliced shares, which only GPUs not in
MIG mode take, are left out of it and counted (``on_mig_gpus``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np

from shared.client import MigschedClient
from shared.events import JobSubmit
from shared.events import Workload as WorkloadSpec
from shared.mig.geometry import GpuModel
from shared.policy.request import Demand, full_profile, resolve_profile
from shared.sim.errors import WorkloadError
from shared.sim.jobs import SimJob, Workload
from shared.sim.workloads.synthetic import CLASSES, MIXES, JobClass, synthetic

DEFAULT_PATIENCE_S = 3600.0
"""The simulator's default queue patience (``SimConfig.patience_s``), in trace seconds."""

Progress = Callable[[int, int], None]


class Replay(msgspec.Struct, kw_only=True):
    workload: str
    speedup: float
    jobs: int
    skipped: dict[str, int]
    started_at: float
    """Wall time of trace time ``t0``."""
    t0: float
    published_at: dict[str, float] = {}
    """job id -> wall time its submit was stored by JetStream."""


def single_instance_classes() -> tuple[JobClass, ...]:
    """The synthetic classes with multi-GPU gangs turned into full-GPU (7g) jobs."""
    out = []
    for c in CLASSES:
        shapes: dict[str, float] = {}
        for s, p in c.shapes.items():
            key = "7g" if s.endswith("gpu") else s
            shapes[key] = shapes.get(key, 0.0) + p
        out.append(msgspec.structs.replace(c, shapes=shapes))
    return tuple(out)


def load(
    trace: str,
    model: GpuModel,
    *,
    limit: int | None = None,
    jobs: int = 200,
    seed: int = 0,
    load_factor: float = 0.8,
    gpus: int = 16,
    mapping: str | None = None,
    window: str = "auto",
) -> Workload:
    """``synthetic`` (``limit`` or else ``jobs`` jobs of four classes, Poisson arrivals at ``load_factor`` of
    ``gpus`` GPUs, multi-GPU jobs as whole-GPU ones), ``synthetic:MIX`` (a mix of the simulator's as it is, e.g.
    ``gangs``: 16- to 128-GPU gangs too), an openb pod list (a path or a variant name such as ``default``), or any
    CSV with a column ``mapping``."""
    kind, colon, mix = trace.partition(":")
    if kind == "synthetic":
        if colon and mix not in MIXES:
            raise WorkloadError(f"unknown synthetic mix {mix!r}: one of {', '.join(MIXES)}")
        return synthetic(
            np.random.default_rng(seed),
            jobs=limit or jobs,
            load=load_factor,
            cluster_slices=gpus * model.compute_slices,
            classes=MIXES[mix] if colon else single_instance_classes(),
            mix=mix or "default",
        )
    if mapping is not None:
        from shared.sim.workloads.csv import load_csv

        wl = load_csv(Path(trace), mapping, model)
        return wl if limit is None else msgspec.structs.replace(wl, jobs=wl.jobs[:limit])
    from shared.sim.workloads.openb import load_openb

    return load_openb(trace, model, window=window, limit=limit)


_LEFT_OUT = {"gpus": "gang (n whole GPUs)", "shared": "time-sliced share"}


def _keep(workload: Workload, kinds: frozenset[str]) -> tuple[Workload, dict[str, int]]:
    """The jobs of ``workload`` whose demand is of one of ``kinds``, and a count of the rest by kind."""
    skipped = Counter(_LEFT_OUT[j.demand.kind] for j in workload.jobs if j.demand.kind not in kinds)
    keep = tuple(j for j in workload.jobs if j.demand.kind in kinds)
    return msgspec.structs.replace(workload, jobs=keep), dict(skipped)


def single_instance(workload: Workload) -> tuple[Workload, dict[str, int]]:
    """The jobs of one MIG instance each (``replay --mig-only``) and a count of the rest."""
    return _keep(workload, frozenset({"mig"}))


def on_mig_gpus(workload: Workload) -> tuple[Workload, dict[str, int]]:
    """The jobs that GPUs in MIG mode run (MIG instances, and whole GPUs as full-size instances, gangs across
    nodes included), the ones the demo replays and compares with the simulator, and a count of the rest: the
    time-sliced shares, which take GPUs not in MIG mode only."""
    return _keep(workload, frozenset({"mig", "gpus"}))


def whole_as_gpus(workload: Workload, model: GpuModel) -> Workload:
    """Each job that asks for a whole GPU as the full-size MIG profile of ``model`` (a trace's one-GPU job:
    ``7g`` on A100 and H100) as ``gpus: 1`` instead, which a GPU not in MIG mode takes too (or the full-size
    instance of an empty MIG GPU)."""
    full = full_profile(model)
    whole = Demand(kind="gpus", gpus=1)

    def convert(job: SimJob) -> SimJob:
        if job.demand.kind == "mig" and resolve_profile(job.demand, model) == full:
            return msgspec.structs.replace(job, demand=whole)
        return job

    return msgspec.structs.replace(workload, jobs=tuple(convert(j) for j in workload.jobs))


def submit_of(job: SimJob, speedup: float, submitted_at: float, prefix: str = "") -> JobSubmit:
    patience = job.patience if job.patience is not None else DEFAULT_PATIENCE_S
    jid = f"{prefix}{job.id}"
    return JobSubmit(
        id=f"submit-{jid}",
        job_id=jid,
        tenant=_token(job.tenant),
        priority=job.priority,
        demand=job.demand,
        latency_sensitive=job.latency_sensitive,
        migratable=job.migratable,
        duration_hint_s=job.duration / speedup,
        patience_s=patience / speedup,
        workload=WorkloadSpec(),
        labels={"wclass": job.wclass[:256]},
        submitted_at=submitted_at,
    )


def _token(tenant: str) -> str:
    cleaned = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in tenant)[:64]
    return cleaned if cleaned[:1].isalnum() else "t" + cleaned[:63]


async def replay(
    client: MigschedClient,
    workload: Workload,
    speedup: float,
    *,
    prefix: str = "",
    progress: Progress | None = None,
    skipped: dict[str, int] | None = None,
) -> Replay:
    """Publish every job at its scaled arrival time (jobs due together go out as one batch)."""
    if speedup <= 0:
        raise ValueError("speed-up must be positive")
    jobs = workload.jobs
    t0 = jobs[0].arrival if jobs else 0.0
    start = time.time()
    out = Replay(
        workload=workload.name,
        speedup=speedup,
        jobs=len(jobs),
        skipped=dict(skipped or {}),
        started_at=start,
        t0=t0,
    )
    i = 0
    while i < len(jobs):
        due = start + (jobs[i].arrival - t0) / speedup
        wait = due - time.time()
        if wait > 0:
            await asyncio.sleep(wait)
        now = time.time()
        batch: list[JobSubmit] = []
        while i < len(jobs) and start + (jobs[i].arrival - t0) / speedup <= now and len(batch) < 512:
            batch.append(submit_of(jobs[i], speedup, now, prefix))
            i += 1
        await client.submit_many(batch)
        stored = time.time()
        for m in batch:
            out.published_at[m.job_id] = stored
        if progress is not None:
            progress(i, len(jobs))
    return out
