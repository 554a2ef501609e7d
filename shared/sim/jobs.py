"""The simulator's job records: one immutable ``SimJob`` per job of a workload, and the ``Workload``
itself."""

from __future__ import annotations

import msgspec
import numpy as np

from shared.policy.placement.decision import JobRequest
from shared.policy.request import Demand

FUTURE, QUEUED, STARTING, RUNNING, DONE, REJECTED = range(6)
"""A job's state in a run: not arrived, waiting, instances being created, running, completed, rejected."""

WORKLOAD_CLASSES = ("inference", "small-training", "large-training", "interactive")
"""Interference classes; a loader may use others (the interference model gives unknown ones a default)."""


class SimJob(msgspec.Struct, frozen=True, kw_only=True):
    """One job as the simulator replays it.

    ``duration`` is the run time at full speed alone on its instance; co-runners slow it down (interference).
    ``shape`` is the MIG shape of the demand (``3g``) or ``7g`` per GPU for whole-GPU jobs: it keys the demand
    mix that the fragmentation rate is weighted by.
    """

    id: str
    arrival: float
    duration: float
    demand: Demand
    shape: str
    tenant: str = "default"
    priority: int = 0
    latency_sensitive: bool = False
    migratable: bool = True
    wclass: str = "inference"
    patience: float | None = None
    """Seconds the job waits in the queue before it is rejected; None = the run's default."""
    within_block: bool | None = None
    """A gang kept within one topology block of the cluster: True required, False preferred, None anywhere."""

    def request(self, hint_s: float | None = None, now: float | None = None,
                blocks: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> JobRequest:
        """What the policy sees; ``blocks``: the cluster's blocks, for a job kept within one."""
        within = self.within_block is not None and self.demand.kind == "gpus"
        return JobRequest(
            duration_hint_s=hint_s,
            now=now,
            submitted_at=self.arrival,
            job_id=self.id,
            demand=self.demand,
            tenant=self.tenant,
            priority=self.priority,
            latency_sensitive=self.latency_sensitive,
            migratable=self.migratable,
            domains=blocks if within else (),
            domain_level="block" if within else "",
            domain_required=bool(within and self.within_block),
        )

    @property
    def gpus(self) -> int:
        return self.demand.gpus if self.demand.kind == "gpus" else 1


class Workload(msgspec.Struct, frozen=True, kw_only=True):
    """Jobs sorted by arrival, plus what the loader dropped and why (so reports can say it)."""

    name: str
    jobs: tuple[SimJob, ...]
    dropped: dict[str, int] = {}
    notes: tuple[str, ...] = ()

    def shapes(self) -> list[str]:
        """One entry per requested instance (a 4-GPU job counts four ``7g``): the demand mix by shape."""
        out: list[str] = []
        for j in self.jobs:
            out.extend([j.shape] * j.gpus)
        return out

    def jittered(self, seconds: float, seed: int) -> Workload:
        """Every arrival shifted by a uniform draw in [-seconds, +seconds] (never before the first arrival),
        re-sorted: replays of a trace that differ only in the order of near-simultaneous arrivals."""
        if seconds <= 0 or not self.jobs:
            return self
        rng = np.random.default_rng(seed)
        t0 = self.jobs[0].arrival
        shift = rng.uniform(-seconds, seconds, len(self.jobs))
        moved = [msgspec.structs.replace(j, arrival=max(t0, j.arrival + float(d)))
                 for j, d in zip(self.jobs, shift, strict=True)]
        return msgspec.structs.replace(
            self, jobs=tuple(sorted(moved, key=lambda j: (j.arrival, j.id))),
            notes=(*self.notes, f"arrivals jittered by up to {seconds:g} s (seed {seed})"))

    def merged(self, other: Workload, name: str | None = None) -> Workload:
        jobs = tuple(sorted((*self.jobs, *other.jobs), key=lambda j: (j.arrival, j.id)))
        dropped = dict(self.dropped)
        for k, v in other.dropped.items():
            dropped[k] = dropped.get(k, 0) + v
        return Workload(
            name=name or f"{self.name}+{other.name}",
            jobs=jobs,
            dropped=dropped,
            notes=(*self.notes, *other.notes),
        )


def sort_jobs(jobs: list[SimJob]) -> tuple[SimJob, ...]:
    return tuple(sorted(jobs, key=lambda j: (j.arrival, j.id)))
