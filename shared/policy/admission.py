"""One admission decision for one pending job: quota, then placement (with the reserve), then preemption.

This is the composition that the balancer service and the simulator both call, so that they decide alike:

1. quota: ``admit_any`` over the charges the job may get (one per GPU model); over quota -> ``Hold("quota")``;
2. placement: ``place_reserving`` (the placement policy, ``placer``, behind the full-size reserve; without one
   ``balancer.place``, the seeds' rule);
3. exact quota check on the chosen placement's charge (the model is known now);
4. no room: ``choose_victims`` (priority preemption, and cohort reclaim when the job fits its own quota),
   on the held-back snapshot unless the job is full-size, so preemption does not eat the reserve either;
5. the answer is ``Start`` (placement + charge + victims to preempt first) or ``Hold`` (reason + detail).

Committing is the caller's: preempt the victims (release their instances, uncharge their stored charges,
re-queue them with reason "preempted"), reserve the placement and charge the book, atomically.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import msgspec

from shared.policy.charges import placement_usage, request_usages
from shared.policy.placement.balancer import BalancerParams
from shared.policy.placement.decision import CannotPlace, JobRequest, Placement
from shared.policy.placement.topology import only
from shared.policy.preemption import NoVictims, Victim, Victims, choose_victims
from shared.policy.priority import PriorityClass
from shared.policy.quota import QuotaBook, Wait, admit, admit_any
from shared.policy.reserve import Placer, ReserveParams, hold_back, place_reserving
from shared.policy.snapshot import ClusterSnapshot

HoldReason = Literal["quota", "capacity", "reserved capacity"]


class Start(msgspec.Struct, frozen=True, kw_only=True):
    """Start the job at ``placement`` after preempting ``victims`` (often none); charge ``usage``."""

    job_id: str
    placement: Placement
    usage: dict[str, float]
    borrowed: dict[str, float] = {}
    victims: tuple[Victim, ...] = ()
    reasons: tuple[str, ...] = ()


class Hold(msgspec.Struct, frozen=True, kw_only=True):
    """The job stays pending: over its quota, no room (even by preemption), or only reserved room left."""

    job_id: str
    reason: HoldReason
    detail: str
    reasons: tuple[str, ...] = ()
    deferred: bool = False
    """Kept waiting by the placement policy's own rule (``CannotPlace.deferred``, a long gang): neither
    preemption nor a reservation starts it sooner."""


Admission = Start | Hold


def decide(
    snap: ClusterSnapshot,
    book: QuotaBook,
    job: JobRequest,
    klass: PriorityClass,
    now: float,
    *,
    balancer: BalancerParams | None = None,
    reserve: ReserveParams | None = None,
    checkpoints: Mapping[str, float] | None = None,
    preempt: bool = True,
    placer: Placer | None = None,
) -> Admission:
    """Quota -> place -> preempt for one job; pure. ``klass`` is the job's resolved priority class; ``placer``
    the placement policy (the one ``MIGSCHED_POLICY`` names; None: ``balancer.place`` with ``balancer``)."""
    options = request_usages(snap, job.demand)
    if options:
        pre = admit_any(book, job.tenant, options)
        if isinstance(pre, Wait):
            return Hold(job_id=job.job_id, reason="quota", detail=pre.detail)
    reserve = reserve or ReserveParams()
    placed = place_reserving(snap, job, reserve, placer=placer, balancer=balancer)
    if isinstance(placed, Placement):
        return _charged(snap, book, job, placed, ())
    if placed.deferred:
        return Hold(job_id=job.job_id, reason="capacity", detail=_first(placed), reasons=placed.reasons,
                    deferred=True)
    reserved = bool(placed.reasons) and placed.reasons[0].startswith("reserved capacity")
    if preempt:
        full = job.demand.kind == "gpus"
        space = snap if full else hold_back(snap, reserve.reserve_full)[0]
        chosen = _victims(space, job, now, klass, book, checkpoints)
        if not isinstance(chosen, NoVictims):
            return _charged(snap, book, job, chosen.placement, chosen.victims)
        extra = chosen.reasons
    else:
        extra = ("preemption off",)
    return Hold(job_id=job.job_id, reason="reserved capacity" if reserved else "capacity",
                detail=_first(placed), reasons=(*placed.reasons, *extra))


def _victims(snap: ClusterSnapshot, job: JobRequest, now: float, klass: PriorityClass, book: QuotaBook,
             checkpoints: Mapping[str, float] | None) -> Victims | NoVictims:
    """``choose_victims``; for a gang that requires one topology domain, the cheapest victims within one."""
    if not (job.domains and job.domain_required):
        return choose_victims(snap, job, now, klass=klass, book=book, checkpoints=checkpoints)
    plain = msgspec.structs.replace(job, domains=())
    best: Victims | None = None
    reasons: list[str] = []
    for name, nodes in job.domains:
        got = choose_victims(only(snap, nodes), plain, now, klass=klass, book=book, checkpoints=checkpoints)
        if isinstance(got, NoVictims):
            reasons.extend(f"{job.domain_level} {name}: {r}" for r in got.reasons[:1])
        elif best is None or got.lost_work_s < best.lost_work_s:
            best = got
    return best if best is not None else NoVictims(job_id=job.job_id, reasons=tuple(reasons) or ("no domain",))


def _first(d: CannotPlace) -> str:
    return d.reasons[0] if d.reasons else "no room"


def _charged(snap: ClusterSnapshot, book: QuotaBook, job: JobRequest, placement: Placement,
             victims: tuple[Victim, ...]) -> Admission:
    usage = placement_usage(snap, placement, job.demand)
    a = admit(book, job.tenant, usage)
    if isinstance(a, Wait):
        return Hold(job_id=job.job_id, reason="quota", detail=a.detail,
                    reasons=(f"placement {placement.slot.gpu_id} {placement.slot.profile} is over quota",))
    return Start(job_id=job.job_id, placement=placement, usage=usage.to_dict(), borrowed=a.borrowed,
                 victims=victims, reasons=(*a.reasons, *placement.reasons))
