"""Who may be preempted for a waiting job, and what preempting a set of jobs costs (``preemption``'s rules).

``Eligibility`` answers, once per job id, whether a running job may be a victim of ``job`` (priority mode or
reclaim of quota lent within a cohort) and why; ``victim_cost`` orders victim sets: fewest jobs, least lost
work (since each started or last checkpointed), lowest highest priority, lowest priority sum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

from shared.policy.charges import instance_usage, request_usages
from shared.policy.placement.decision import JobRequest
from shared.policy.priority import PriorityClass
from shared.policy.quota import QuotaBook, within_nominal
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView

Why = Literal["priority", "reclaim"]


LOST_SCALE = 1_000_000
"""Lost work is compared in microseconds, as integers, so that equal sums tie exactly."""
LOW = -(2**62)
BLOCKED = "only equal/higher-priority or protected jobs in the way"
Key = tuple[int, float, int, int, int, int, int]


class Eligibility:
    """Decides, once per job id, whether a running job may be preempted by ``job`` and why."""

    def __init__(self, snap: ClusterSnapshot, job: JobRequest, klass: PriorityClass | None,
                 book: QuotaBook | None, now: float, checkpoints: Mapping[str, float]) -> None:
        self.snap = snap
        self.job = job
        self.now = now
        self.checkpoints = checkpoints
        self.by_priority = klass is None or klass.may_preempt
        self.reclaim: dict[str, frozenset[str]] = {}
        self.reclaim_any = True
        self.cohort = book.policy.cohort_of(job.tenant) if book is not None else None
        if book is not None and self.cohort is not None:
            rule = book.policy.cohort_policy(self.cohort).reclaim
            options = request_usages(snap, job.demand)
            if rule != "Never" and any(within_nominal(book, job.tenant, u) for u in options):
                self.reclaim_any = rule == "Any"
                self.reclaim = {t: frozenset(b) for t, b in book.borrowing(self.cohort).items()
                                if t != job.tenant}
        self._seen: dict[str, tuple[Why, str] | None] = {}

    @property
    def anything(self) -> bool:
        return self.by_priority or bool(self.reclaim)

    def why(self, gpu: GpuView, inst: InstanceView) -> tuple[Why, str] | None:
        assert inst.job_id is not None
        if inst.job_id in self._seen:
            return self._seen[inst.job_id]
        out: tuple[Why, str] | None = None
        lower = inst.priority < self.job.priority
        if not inst.preemptible or inst.job_id == self.job.job_id:
            out = None
        elif self.by_priority and lower:
            out = ("priority", f"priority {inst.priority} < {self.job.priority}")
        elif inst.tenant in self.reclaim and (self.reclaim_any or lower):
            charged = instance_usage(gpu, self.snap.geometry.model(gpu.model), inst)
            over = sorted(r for r in self.reclaim[inst.tenant] if charged.amount(r) > 0)
            if over:
                out = ("reclaim", f"{inst.tenant} borrows {', '.join(over)} from cohort {self.cohort}")
        self._seen[inst.job_id] = out
        return out

    def lost(self, inst: InstanceView) -> float:
        since = max(inst.started_at, self.checkpoints.get(inst.job_id or "", -math.inf))
        return max(0.0, self.now - since)


def victim_cost(victims: dict[str, InstanceView], elig: Eligibility) -> tuple[int, float, int, int]:
    prios = [v.priority for v in victims.values()]
    lost = round(sum(elig.lost(v) for v in victims.values()), 6)
    return len(victims), lost, max(prios, default=0), sum(prios)
