"""The balancer's tenancy decisions: resolve a job's priority class, call ``admission.decide`` (quota -> place
behind the reserve -> preemption), order the queue head fairly, and record every preemption.

The commit itself is the ``reserve`` transition with ``victims`` (``lua/reserve.lua``): in one script the
victims are checked to still run where the decision saw them, their instances are idled and their jobs
re-queued (reason ``preempted by <job>: <detail>``, original submit time), then the new job's slot is
reserved with the compare-and-set on the GPU's version.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shared import telemetry
from shared.bus import Outgoing
from shared.errors import RequestError
from shared.events import Preempted, Subjects
from shared.policy.admission import Admission, decide
from shared.policy.charges import capacity_of, request_usages
from shared.policy.placement.balancer import BalancerParams
from shared.policy.placement.decision import JobRequest
from shared.policy.preemption import Victim
from shared.policy.priority import PriorityClass
from shared.policy.queue_order import PendingJob
from shared.policy.reserve import Placer
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView

if TYPE_CHECKING:
    from services.balancer.candidate import Candidate
    from services.balancer.tenancy import TenantLedger

_tracer = telemetry.tracer("migsched.balancer")


def admit_job(
    ledger: TenantLedger, snap: ClusterSnapshot, c: Candidate, params: BalancerParams, now: float,
    within: Mapping[str, Any] | None = None, placer: Placer | None = None,
) -> tuple[PriorityClass, int, Admission] | str:
    """One job's admission; a string is why the request can never be placed (it is rejected). ``within``: a
    gang's topology domains (``JobRequest`` fields); ``placer``: the placement policy (None: the seeds' rule with
    ``params``)."""
    sub = c.submit
    try:
        klass, prio = ledger.job_priority(sub.tenant, sub.priority_class, sub.priority)
    except RequestError as exc:
        return str(exc)
    req = JobRequest(
        job_id=sub.job_id,
        demand=sub.demand,
        tenant=sub.tenant,
        priority=prio,
        latency_sensitive=sub.latency_sensitive,
        migratable=sub.migratable,
        duration_hint_s=sub.duration_hint_s,
        now=now,
        submitted_at=sub.submitted_at,
        **(within or {}),
    )
    return klass, prio, decide(snap, ledger.book, req, klass, now, balancer=params, reserve=ledger.reserve,
                               placer=placer)


def fair_order(ledger: TenantLedger, snap: ClusterSnapshot, cands: Sequence[Candidate]) -> list[Candidate]:
    """The queue head in ``queue_order.order``: priority, then dominant-resource fair share between tenants,
    then age; jobs over their quota last (``decide`` holds them again with reason "quota")."""
    by_id = {c.submit.job_id: c for c in cands}
    pending = []
    usages: dict[Any, tuple[Any, ...]] = {}
    for c in cands:
        sub = c.submit
        try:
            _, prio = ledger.job_priority(sub.tenant, sub.priority_class, sub.priority)
        except RequestError:
            prio = sub.priority
        if sub.demand not in usages:
            usages[sub.demand] = request_usages(snap, sub.demand)
        pending.append(
            PendingJob(
                job_id=sub.job_id,
                tenant=sub.tenant,
                priority=prio,
                submitted_at=sub.submitted_at,
                usages=usages[sub.demand],
            )
        )
    return [by_id[e.job.job_id] for e in ledger.order(pending, capacity_of(snap))]


def placed_view(gpu: GpuView, victims: Sequence[Victim]) -> GpuView:
    """The GPU as the node registry must plan on it: the victims' instances idle (stopped before the ops)."""
    if not victims:
        return gpu
    gone = {i for v in victims for i in v.instance_ids}
    return gpu.with_instances(
        [
            InstanceView(id=i.id, profile=i.profile, start=i.start, size=i.size, compute=i.compute)
            if i.id in gone
            else i
            for i in gpu.instances
        ]
    )


def wire_priority(prio: int) -> int:
    """A class value (up to 1e9) as the wire's bounded ``priority`` (-1000..1000)."""
    return max(-1000, min(1000, prio))


def record_preemptions(
    ledger: TenantLedger, log: logging.Logger, c: Candidate, victims: Sequence[Victim], now: float
) -> None:
    """Log and trace each preemption (the job history has it already: the transition wrote it)."""
    sub = c.submit
    ledger.preemptions += len(victims)
    with _tracer.start_as_current_span("balancer preempt", context=c.ctx) as span:
        span.set_attribute("migsched.job_id", sub.job_id)
        span.set_attribute("migsched.preempted", [v.job_id for v in victims])
        for v in victims:
            attrs: dict[str, str | int | float | bool] = {
                "migsched.preemptor": sub.job_id,
                "migsched.victim": v.job_id,
                "migsched.victim_tenant": v.tenant,
                "migsched.victim_priority": v.priority,
                "migsched.why": v.why,
                "migsched.detail": v.detail,
                "migsched.lost_work_s": v.lost_work_s,
            }
            span.add_event("preempted", attrs)
            if c.delivery is not None:
                c.delivery.span.add_event("preempted", attrs)
            log.info(
                "job %s (%s) preempted %s of %s (%s: %s; %.1fs of work lost)",
                sub.job_id,
                sub.tenant,
                v.job_id,
                v.tenant,
                v.why,
                v.detail,
                v.lost_work_s,
            )


def preemption_events(subjects: Subjects, c: Candidate, victims: Sequence[Victim], attempt: int, now: float,
                      ) -> list[Outgoing]:
    """One ``sched.preempted`` per victim of ``c``'s placement. The id names the victim, the preemptor and its
    attempt, so a placement published again after a crash announces nothing twice (JetStream's duplicate
    window)."""
    by = c.submit.job_id
    return [
        Outgoing(subjects.sched_preempted, Preempted(
            id=f"preempt:{v.job_id}:{by}:{attempt}"[:200], job_id=v.job_id, by=by, tenant=v.tenant,
            priority=wire_priority(v.priority), reason=v.detail[:2000], lost_work_s=min(max(v.lost_work_s, 0.0), 1e8),
            gpu_ids=v.gpu_ids[:4096], at=now,
        ), c.ctx)
        for v in victims
    ]
