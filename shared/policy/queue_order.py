"""The order in which pending jobs are tried: priority, then fair share between tenants, then age.

Within one priority level, tenants take turns by **dominant resource share** (DRF): a tenant's share is the
larger of its compute-slice and memory-GiB usage, each divided by the tenant's nominal quota of that resource
when it has a finite positive one, else by the cluster's capacity. The tenant with the lowest share goes next
with its oldest job; its share then grows by that job's charge, as if it had started, so a burst from one
tenant interleaves with the others instead of queueing in front of them. Ties: older job, then tenant name.

A job whose admission would exceed its tenant's quota is not rejected: it stays pending with status ``quota``
and its detail, after every ready job (keeping its own order), and is tried again when usage drops.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import msgspec

from shared.policy.quota import QuotaBook, Wait, admit_any
from shared.policy.resources import COMPUTE, EMPTY, MEMORY, Usage


class PendingJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job waiting to start, with its possible charges (``charges.request_usages``; one per GPU model)."""

    job_id: str
    tenant: str
    priority: int
    submitted_at: float
    usages: tuple[Usage, ...] = ()

    @property
    def usage(self) -> Usage:
        """The charge used for fair share: the first option (they differ only between GPU models)."""
        return self.usages[0] if self.usages else EMPTY


class QueueEntry(msgspec.Struct, frozen=True, kw_only=True):
    job: PendingJob
    rank: int
    status: Literal["ready", "quota"]
    share: float
    """The tenant's dominant share when this job was ordered (before it)."""
    detail: str = ""


def dominant_share(book: QuotaBook, tenant: str, usage: Mapping[str, float],
                   capacity: Mapping[str, float]) -> float:
    """max over compute slices and GiB of usage / (tenant's nominal, or the cluster's capacity)."""
    tq = book.policy.tenant(tenant)
    share = 0.0
    for r in (COMPUTE, MEMORY):
        denom = tq.nominal(r) if tq is not None else math.inf
        if math.isinf(denom) or denom <= 0:
            denom = capacity.get(r, 0.0)
        if denom > 0:
            share = max(share, usage.get(r, 0.0) / denom)
    return share


def order(pending: Iterable[PendingJob], book: QuotaBook, capacity: Mapping[str, float]) -> list[QueueEntry]:
    """Every pending job once, in the order to try them; quota-blocked ones last, with their reason."""
    ready: dict[int, list[PendingJob]] = {}
    blocked: list[tuple[PendingJob, Wait]] = []
    seen: dict[tuple[str, tuple[Usage, ...]], Wait | None] = {}  # same tenant + same charges: same answer
    for job in pending:
        memo = (job.tenant, job.usages)
        if memo not in seen:
            a = admit_any(book, job.tenant, job.usages)
            seen[memo] = a if isinstance(a, Wait) else None
        wait = seen[memo]
        if wait is not None:
            blocked.append((job, wait))
        else:
            ready.setdefault(job.priority, []).append(job)
    out: list[QueueEntry] = []
    shares = _Shares(book, capacity)
    for prio in sorted(ready, reverse=True):
        for job, share in _fair(ready[prio], shares):
            out.append(QueueEntry(job=job, rank=len(out), status="ready", share=share))
    blocked.sort(key=lambda jw: (-jw[0].priority, jw[0].submitted_at, jw[0].job_id))
    for job, wait in blocked:
        out.append(QueueEntry(job=job, rank=len(out), status="quota", share=shares.of(job.tenant),
                              detail=wait.detail))
    return out


class _Shares:
    """Each tenant's hypothetical (compute, GiB) usage and its DRF denominators, as plain floats."""

    def __init__(self, book: QuotaBook, capacity: Mapping[str, float]) -> None:
        self.book = book
        self.capacity = capacity
        self.used: dict[str, list[float]] = {}
        self.denom: dict[str, tuple[float, float]] = {}

    def _init(self, tenant: str) -> list[float]:
        u = self.book.used(tenant)
        self.used[tenant] = [u.amount(COMPUTE), u.amount(MEMORY)]
        tq = self.book.policy.tenant(tenant)
        dd = []
        for r in (COMPUTE, MEMORY):
            d = tq.nominal(r) if tq is not None else math.inf
            if math.isinf(d) or d <= 0:
                d = self.capacity.get(r, 0.0)
            dd.append(d)
        self.denom[tenant] = (dd[0], dd[1])
        return self.used[tenant]

    def of(self, tenant: str) -> float:
        u = self.used.get(tenant) or self._init(tenant)
        dc, dm = self.denom[tenant]
        return max(u[0] / dc if dc > 0 else 0.0, u[1] / dm if dm > 0 else 0.0)

    def add(self, tenant: str, usage: Usage) -> None:
        u = self.used.get(tenant) or self._init(tenant)
        u[0] += usage.amount(COMPUTE)
        u[1] += usage.amount(MEMORY)


def _fair(jobs: Sequence[PendingJob], shares: _Shares) -> Iterable[tuple[PendingJob, float]]:
    """One priority level in DRF order; ``shares`` carries the hypothetical usage across levels."""
    queues: dict[str, deque[PendingJob]] = {}
    for job in sorted(jobs, key=lambda j: (j.submitted_at, j.job_id)):
        queues.setdefault(job.tenant, deque()).append(job)
    heap = [(shares.of(t), q[0].submitted_at, q[0].job_id, t) for t, q in queues.items()]
    heapq.heapify(heap)
    while heap:
        share, _, _, tenant = heapq.heappop(heap)
        q = queues[tenant]
        job = q.popleft()
        yield job, share
        shares.add(tenant, job.usage)
        if q:
            heapq.heappush(heap, (shares.of(tenant), q[0].submitted_at, q[0].job_id, tenant))
