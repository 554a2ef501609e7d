"""The large jobs waiting in one shard, in queue order: what a new large job would queue behind there.

A job waits in the shard it was sent to, so where a large job (whole GPUs) that no shard can place now should
wait depends on when it would start in each: after the shard's running jobs end (their hints) and after the large
jobs queued ahead of it start and end in turn (``routing.expected_start``). Each backfill pass sets a shard's
backlog from the head of its queue; a new large job queued between passes joins the backlog of its shard at once,
so that the next one sees it there (jobs arriving together do not all go where the GPUs free first). Large jobs
only: a small one starts in whatever frees first and delays no large job it would have to queue behind.
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
    priority: int
    need: int
    """Whole GPUs (``reservation.whole_gpus``)."""
    plain: bool
    """A ``gpus: n`` job: it may run on GPUs not in MIG mode too."""
    hint_s: float | None


class Backlog:
    def __init__(self) -> None:
        self.jobs: list[Ahead] = []

    def reset(self, subs: Iterable[JobSubmit], models: Sequence[GpuModel]) -> None:
        """A backfill pass read the head of the shard's queue (``subs``, in its order; ``models``: the shard's)."""
        self.jobs = [a for s in subs if (a := _ahead(s, models)) is not None][:MAX_KEPT]

    def queued(self, sub: JobSubmit, models: Sequence[GpuModel]) -> None:
        """A new job was queued in the shard: behind those of its priority or higher."""
        a = _ahead(sub, models)
        if a is None or len(self.jobs) >= MAX_KEPT or any(x.job_id == sub.job_id for x in self.jobs):
            return
        at = next((k for k, x in enumerate(self.jobs) if x.priority < sub.priority), len(self.jobs))
        self.jobs.insert(at, a)

    def left(self, job_id: str) -> None:
        """The job was placed, or left the queue otherwise."""
        self.jobs = [a for a in self.jobs if a.job_id != job_id]

    def ahead_of(self, priority: int) -> list[Ahead]:
        """The jobs a new job of ``priority`` would queue behind."""
        return [a for a in self.jobs if a.priority >= priority]


def _ahead(sub: JobSubmit, models: Sequence[GpuModel]) -> Ahead | None:
    need = whole_gpus(models, sub.demand)
    if need <= 0:
        return None
    return Ahead(sub.job_id, sub.priority, need, sub.demand.kind == "gpus", sub.duration_hint_s)
