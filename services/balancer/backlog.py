"""The large jobs waiting in one shard, in queue order: what a new large job would queue behind there.

A job waits in the shard it was sent to, so where a large job (whole GPUs) that no shard can place now should
wait depends on when it would start in each: after the shard's running jobs end (their hints) and after the large
jobs queued ahead of it start and end in turn (``routing.expected_start``). Each backfill pass sets a shard's
backlog from the head of its queue; a new large job joins the backlog of the shard it waits in as soon as that is
decided, so that the next one sees it there (jobs arriving together do not all go where the GPUs free first).
Large jobs only: a small one starts in whatever frees first and delays no large job it would have to queue
behind.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from shared.events import JobSubmit
from shared.mig.geometry import GpuModel
from shared.policy.reservation import whole_gpus

MAX_KEPT = 256
"""Jobs kept per shard (the head of its queue); the estimate reads fewer (``routing.AHEAD_PLANNED``)."""


class Ahead(msgspec.Struct, frozen=True):
    job_id: str
    need: int
    """Whole GPUs (``reservation.whole_gpus``)."""
    plain: bool
    """A ``gpus: n`` job: it may run on GPUs not in MIG mode too."""
    hint_s: float | None


class Backlog:
    def __init__(self, kept: bool = True) -> None:
        self.kept = kept
        """False where nothing reads it (one shard, or a policy that never holds): every change is skipped."""
        self.jobs: list[Ahead] = []
        self.version = 0
        """Moves at every change: an estimate played out over the backlog is kept while it stays."""

    def reset(self, subs: Iterable[JobSubmit], models: Sequence[GpuModel]) -> None:
        """A backfill pass read the head of the shard's queue (``subs``, in its order; ``models``: the shard's)."""
        if not self.kept:
            return
        self.jobs = [a for s in subs if (a := _ahead(s, models)) is not None][:MAX_KEPT]
        self.version += 1

    def queued(self, sub: JobSubmit, models: Sequence[GpuModel]) -> None:
        """A new job was queued in the shard, or sent there to wait."""
        if not self.kept:
            return
        a = _ahead(sub, models)
        if a is None or len(self.jobs) >= MAX_KEPT or any(x.job_id == sub.job_id for x in self.jobs):
            return
        self.jobs.append(a)
        self.version += 1

    def left(self, job_id: str) -> None:
        """The job was placed, or left the queue otherwise."""
        if any(a.job_id == job_id for a in self.jobs):
            self.jobs = [a for a in self.jobs if a.job_id != job_id]
            self.version += 1

    def ahead(self, limit: int) -> list[Ahead]:
        """The first ``limit`` jobs a new one would queue behind. Priorities are left out: a backfill pass reads
        the queue before tenancy resolves each job's class, and a job that outranks the ones waiting preempts
        rather than waits; the estimate errs late for it, in every shard alike."""
        return self.jobs[:limit]


def _ahead(sub: JobSubmit, models: Sequence[GpuModel]) -> Ahead | None:
    need = whole_gpus(models, sub.demand)
    if need <= 0:
        return None
    return Ahead(sub.job_id, need, sub.demand.kind == "gpus", sub.duration_hint_s)
