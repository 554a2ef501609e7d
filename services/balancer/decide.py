"""The balancer's decision for one job, on its shard's mirror: place it (the reservation to commit), or queue it
with the reasons, or reject it.

A placement is applied to the mirror at once, so that the next decision of the batch sees it; the commit
(``commit``) then either confirms it or reloads those GPUs. With tenancy the job goes through the quota path
(quota -> place behind the reserve -> preempt); without, through the named policy, keeping off GPUs held for
larger waiting jobs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from services.balancer import metrics as m
from services.balancer.candidate import Candidate
from services.balancer.mirror import reservation_instance
from services.balancer.preempting import admit_job, placed_view
from services.balancer.routing import Played, empty_gpus, launches_per_node, mig_gpus, never_here, sooner_elsewhere
from services.balancer.shards import Shards
from services.balancer.tenancy import TenantLedger
from services.common.metric_cache import child
from shared.events import JobSubmit
from shared.mig.geometry import Geometry
from shared.policy.admission import Hold, Start
from shared.policy.charges import slot_usages
from shared.policy.placement.balancer import BalancerParams
from shared.policy.placement.decision import CannotPlace, JobRequest, Placement, Slot
from shared.policy.placement.registry import PlacementPolicy
from shared.policy.preemption import Victim
from shared.policy.reservation import expected_run, whole_gpus
from shared.policy.snapshot import ClusterSnapshot
from shared.ports import TransitionBatch
from shared.state import Eviction, Reservation, SlotReservation, empty_shard, shard_of
from shared.state.model import PLAIN_PROFILES

Places = Callable[[int, frozenset[str], frozenset[str], dict[str, Any]], CannotPlace | None]
"""Whether a job can start on shard ``s`` now (None), or why not, given the GPUs held there, its MIG GPUs (a
per-node launch) and its topology fields there."""


@dataclass(frozen=True, slots=True)
class Booking:
    """What a committed placement needs afterwards: the GPU as the command plans from it, the version the
    reservation expects, the preempted jobs, and whether the quota ledger was charged."""

    gpu_before: Any
    ver: int
    victims: tuple[Victim, ...]
    booked: bool
    views: dict[str, Any] = field(default_factory=dict)
    """A gang on MIG GPUs: every GPU as the commands plan from it (the first is ``gpu_before``)."""


@dataclass(slots=True)
class Decided:
    """One job's decision in a round, and the index of its transition in the round's batch (-1: none)."""

    cand: Candidate
    dec: Placement | CannotPlace
    idx: int
    booking: Booking | None = None
    route: int | None = None
    """A new job its home shard cannot place now, but this shard can, or would start it sooner: routed there,
    then decided again."""
    route_why: str = "no_room_now"
    """``migsched_jobs_routed_total``'s reason: ``no_room_now`` or ``sooner_elsewhere``."""


@dataclass(slots=True)
class RoundMemo:
    """Within a round the mirror only loses room, so a demand that cannot be placed stays so (and a tenancy hold
    stays a hold, the book only grows): each is decided once per round."""

    no_room: dict[tuple[int, Any, frozenset[str], Any], CannotPlace] = field(default_factory=dict)
    held: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    empty: dict[int, int] = field(default_factory=dict)
    """Per shard, its empty GPUs at the round's first look: the order in which other shards are tried for a new
    job (an order only, so not kept up to date within the round)."""
    routed: dict[int, int] = field(default_factory=dict)
    """Per shard, the whole GPUs of the jobs sent there this round to be placed in the next: its mirror does not
    show them taken yet, so large jobs sent after them would find the same room."""
    played: Played = field(default_factory=dict)
    """Per shard, its GPUs' expected free times once its backlog has run (``routing.after_backlog``)."""


class DecisionMetrics:
    def __init__(self) -> None:
        self.seconds = m.DECISION_SECONDS
        self.outcome = {o: child(m.DECISIONS, o)
                        for o in ("placed", "pending", "duplicate", "conflict", "rejected")}


class Decider:
    def __init__(self, shards: Shards, ledger: TenantLedger, params: BalancerParams, policy: PlacementPolicy | None,
                 reserves: bool, geometry: Geometry, metrics: DecisionMetrics, default_hint_s: float = 0.0) -> None:
        self.shards = shards
        self.default_hint_s = default_hint_s
        """The expected run of a job without a hint (``MIGSCHED_DEFAULT_HINT_S``), written as its instances'
        end."""
        self.ledger = ledger
        self.params = params
        self.policy = policy
        self.reserves = reserves
        self.geometry = geometry
        self.metrics = metrics

    def decide(self, c: Candidate, batch: TransitionBatch, now: float, memo: RoundMemo) -> Decided | None:
        """Decide ``c`` and queue its transition in ``batch``; None when it was rejected outright."""
        sub = c.submit
        shard = self.shards.of_job(sub.job_id)
        mirror = self.shards.mirrors[shard]
        holds = self.shards.holds[shard]
        held, mig = self._unusable(shard, sub, now)
        blocked = held | mig
        known = memo.no_room.get((shard, sub.demand, blocked, sub.topology))
        if known is not None:  # its shard cannot place it: a new job may still go to another that can
            there = (self._now_elsewhere(c, shard, now, memo, self._placed(self._request(sub, now, shard, {})))
                     if self._may_route(c, shard) else None)
            if there is not None:
                return Decided(c, known, -1, route=there[0], route_why=there[1])
            return self._queue(c, known, batch, now)
        klass: Any = None
        victims: tuple[Victim, ...] = ()
        usage: dict[str, float] = {}
        t0 = time.perf_counter()
        dec: Placement | CannotPlace
        within = self.shards.within(shard, sub)
        too_big = never_here(self.shards, shard, sub)
        if too_big is not None:  # no set of nodes here could ever host it: rejected at once, with the reason
            batch.settle(sub.job_id, "rejected", too_big, now, ("-", "pending"), c.spec)
            self.metrics.outcome["rejected"].inc()
            return None
        stranded = (empty_shard(shard, [len(mm) for mm in self.shards.mirrors])
                    if self.shards.count > 1 and not len(mirror) else None)
        if stranded is not None:  # waits (nodes may still register there), saying why nothing else will help
            return self._queue(c, CannotPlace(job_id=sub.job_id, policy="shards", reasons=(stranded,)), batch, now)
        if self.ledger.active:  # quota -> place (behind the reserve and the holds) -> preempt
            hk = (shard, sub.demand, sub.tenant, sub.priority_class, sub.priority, sub.topology, blocked)
            adm = memo.held.get(hk) or self._admit(shard, c, blocked, within, now)
            self.metrics.seconds.observe(time.perf_counter() - t0)
            if isinstance(adm, str):  # a request error (unknown priority class): never placeable
                batch.settle(sub.job_id, "rejected", adm[:500], now, ("-", "pending"), c.spec)
                self.metrics.outcome["rejected"].inc()
                return None
            klass, c.prio, answer = adm
            if isinstance(answer, Hold):  # waits: quota | capacity | reserved capacity
                if not answer.deferred:  # the policy's own rule for this job depends on its hint and age
                    memo.held[hk] = adm
                closed = self._closed(shard, sub, now) if answer.reason == "capacity" else None
                why = f"{answer.reason}: {answer.detail}" + (f"; {closed}" if closed else "")
                hold = CannotPlace(job_id=sub.job_id, policy="tenancy", reasons=(why[:1000], *answer.reasons))
                there = (self._now_elsewhere(c, shard, now, memo, self._admitted(c, now, memo))
                         if answer.reason == "capacity" else None)
                if there is not None:
                    return Decided(c, hold, -1, route=there[0], route_why=there[1])
                if answer.reason == "capacity" and not answer.deferred:
                    hold = self._consider_hold(c, shard, hold, mig, within, now)
                idx = batch.enqueue(sub.job_id, c.spec, c.priority, sub.submitted_at, hold.reasons[0][:1000], now,
                                    c.traceparent)
                if not c.from_queue:
                    self._waits_in(shard, sub)
                return Decided(c, hold, idx)
            assert isinstance(answer, Start)
            dec = answer.placement
            victims, usage = answer.victims, answer.usage
        else:
            req = self._request(sub, now, shard, within)
            dec = mirror.decide(req, self.params, self.policy, blocked)  # applied below
            self.metrics.seconds.observe(time.perf_counter() - t0)
        if isinstance(dec, CannotPlace):
            if dec.deferred:  # kept waiting by the policy's rule for this job (a long gang): no hold, no memo
                return self._queue(c, dec, batch, now)
            memo.no_room[(shard, sub.demand, blocked, sub.topology)] = dec
            there = None if self.ledger.active else self._now_elsewhere(c, shard, now, memo, self._placed(req))
            if there is not None:
                return Decided(c, dec, -1, route=there[0], route_why=there[1])
            return self._queue(c, self._consider_hold(c, shard, dec, mig, within, now), batch, now)
        holds.placed(sub.job_id)
        self.shards.backlogs[shard].left(sub.job_id)
        return self._reserve(c, dec, shard, klass, victims, usage, batch, now)

    def _request(self, sub: JobSubmit, now: float, shard: int, within: dict[str, Any] | None = None) -> JobRequest:
        """What the policy decides on: the submit, with its topology domains in ``shard``."""
        req = JobRequest(job_id=sub.job_id, demand=sub.demand, tenant=sub.tenant, priority=sub.priority,
                         latency_sensitive=sub.latency_sensitive, migratable=sub.migratable,
                         duration_hint_s=sub.duration_hint_s, now=now, submitted_at=sub.submitted_at)
        within = self.shards.within(shard, sub) if within is None else within
        return msgspec.structs.replace(req, **within) if within else req

    def _consider_hold(self, c: Candidate, shard: int, dec: CannotPlace, mig: frozenset[str],
                       within: dict[str, Any], now: float) -> CannotPlace:
        """During a backfill pass, with a policy that reserves: a hold for a large job that cannot be placed
        (``Holds.consider``), named first among the reasons it waits."""
        if not (c.from_queue and self.reserves):
            return dec
        got = self.shards.holds[shard].consider(self.shards.mirrors[shard].view().without(mig), c.submit, now,
                                                within.get("domains", ()), within.get("domain_required", False))
        if got is None:
            return dec
        return msgspec.structs.replace(dec, reasons=(f"reserved: {got.explain(now)}", *dec.reasons))

    def _now_elsewhere(self, c: Candidate, home: int, now: float, memo: RoundMemo,
                       places: Places) -> tuple[int, str] | None:
        """The shard, other than its ``home``, that can place a new job now (``places``; the one with the most
        empty GPUs first), so that shards of unequal size fill alike rather than queue at one while another
        idles; when none can, with a policy that reserves, the one where a large job is expected to start
        soonest (``routing.sooner_elsewhere``); None when it stays at home. Asked once per job, before anything
        of it is recorded; a job waits where it was sent. With the reason, for the metric."""
        sub = c.submit
        count = self.shards.count
        if not self._may_route(c, home):
            return None
        c.routed = True
        others = [s for s in range(count) if s != home and len(self.shards.mirrors[s])]
        for s in others:
            if s not in memo.empty:
                memo.empty[s] = empty_gpus(self.shards.mirrors[s].view())
        need = whole_gpus(self.shards.mirrors[home].view().model_list, sub.demand)
        for s in sorted(others, key=lambda s: (-memo.empty[s], s)):
            if never_here(self.shards, s, sub) is not None:
                continue
            promised = memo.routed.get(s, 0)
            if need and promised and empty_gpus(self.shards.mirrors[s].view()) - promised < need:
                continue  # whole GPUs already promised to jobs sent there this round
            held, mig = self._unusable(s, sub, now)
            key = (s, sub.demand, held | mig, sub.topology)
            if key in memo.no_room:
                continue
            why = places(s, held, mig, self.shards.within(s, sub))
            if why is None:
                memo.routed[s] = memo.routed.get(s, 0) + need
                self._waits_in(s, sub)  # until it is placed there, in the next round
                return s, "no_room_now"
            if not self.ledger.active:  # an admission depends on the tenant and priority: never remembered
                memo.no_room[key] = why
        there = sooner_elsewhere(self.shards, home, sub, now, memo.played) if self.reserves else None
        if there is None:
            return None
        self._waits_in(there, sub)  # before the next job of the round is routed
        return there, "sooner_elsewhere"

    def _may_route(self, c: Candidate, home: int) -> bool:
        """Whether ``c`` may still go to another shard: a new job, not routed yet, decided in its home shard
        (crc32 of its id), with several shards."""
        count = self.shards.count
        return not (c.from_queue or c.routed or count <= 1) and home == shard_of(c.submit.job_id, count)

    def _waits_in(self, shard: int, sub: JobSubmit) -> None:
        """A new job will wait in ``shard``: a large one joins its backlog, where the next one sees it."""
        backlog = self.shards.backlogs[shard]
        if backlog.kept:  # the models are read only where the backlog is
            backlog.queued(sub, self.shards.mirrors[shard].view().model_list)

    def _unusable(self, shard: int, sub: JobSubmit, now: float) -> tuple[frozenset[str], frozenset[str]]:
        """The GPUs of ``shard`` that ``sub`` may not use: those held for larger waiting jobs, and, for a
        per-node gang, those in MIG mode (its process sees every GPU of its node: never a MIG device)."""
        held = (frozenset(self.shards.holds[shard].blocked(sub.job_id, sub.duration_hint_s, now))
                if self.reserves else frozenset())
        mig = mig_gpus(self.shards.mirrors[shard].view()) if launches_per_node(sub) else frozenset()
        return held, mig

    def _closed(self, shard: int, sub: JobSubmit, now: float) -> str | None:
        """Why the shard's holds keep GPUs from ``sub``, as a reason of its own (None when they keep none)."""
        return self.shards.holds[shard].closed_to(sub.job_id, sub.duration_hint_s, now) if self.reserves else None

    def _placed(self, req: JobRequest) -> Places:
        """Whether the policy places ``req`` on a shard's mirror now: None if so, else why not."""
        def places(s: int, blocked: frozenset[str], mig: frozenset[str], within: dict[str, Any]) -> CannotPlace | None:
            job = msgspec.structs.replace(req, **within) if within else req
            dec = self.shards.mirrors[s].decide(job, self.params, self.policy, blocked | mig)
            return dec if isinstance(dec, CannotPlace) else None
        return places

    def _admit(self, shard: int, c: Candidate, blocked: frozenset[str], within: dict[str, Any],
               now: float) -> tuple[Any, int, Any] | str:
        """The tenancy's admission of ``c`` on ``shard`` (``admit_job``), placing through the mirror's index:
        on the shard's whole snapshot the policy's answer is the index's (``Mirror.decide``); only a placement
        on a part of it (behind the full-size reserve) is the policy's over that part."""
        mirror = self.shards.mirrors[shard]
        # the view, not a copy: the admission reads it and returns before the mirror next changes
        snap = mirror.view().without(blocked)
        policy = self.policy
        if policy is None:
            return admit_job(self.ledger, snap, c, self.params, now, within, None)

        def placer(part: ClusterSnapshot, job: JobRequest) -> Placement | CannotPlace:
            return mirror.decide(job, self.params, policy, blocked) if part is snap else policy(part, job)

        return admit_job(self.ledger, snap, c, self.params, now, within, placer)

    def _admitted(self, c: Candidate, now: float, memo: RoundMemo) -> Places:
        """Whether the tenancy's admission starts ``c`` on a shard now (by preemption, too): None if so. A hold
        is remembered for the round as ``decide`` remembers its own (the same admission, on the same mirror)."""
        sub = c.submit

        def places(s: int, held: frozenset[str], mig: frozenset[str], within: dict[str, Any]) -> CannotPlace | None:
            blocked = held | mig
            hk = (s, sub.demand, sub.tenant, sub.priority_class, sub.priority, sub.topology, blocked)
            got = memo.held.get(hk) or self._admit(s, c, blocked, within, now)
            if not isinstance(got, str) and isinstance(got[2], Start):
                return None
            if not isinstance(got, str) and not (isinstance(got[2], Hold) and got[2].deferred):
                memo.held[hk] = got
            return CannotPlace(job_id=sub.job_id, policy="tenancy", reasons=("held in that shard too",))
        return places

    def _queue(self, c: Candidate, dec: CannotPlace, batch: TransitionBatch, now: float) -> Decided:
        """A fresh job is queued with its reasons; one taken from the queue stays there."""
        if c.from_queue:
            return Decided(c, dec, -1)
        sub = c.submit
        shard = self.shards.of_job(sub.job_id)
        self._waits_in(shard, sub)
        # with several shards the counts in the reasons are the shard's: say so, or they contradict the cluster
        # view beside them (free GPUs in another shard)
        where = f" in shard {shard} of {self.shards.count}" if self.shards.count > 1 else ""
        closed = self._closed(shard, sub, now)
        apart = f"{closed}; apart from them: " if closed else ""  # the counts that follow: GPUs it may use
        reason = (f"cannot place{where}: {apart}" + "; ".join(dec.reasons))[:1000]
        return Decided(c, dec, batch.enqueue(sub.job_id, c.spec, sub.priority, sub.submitted_at, reason, now,
                                             c.traceparent))

    def _reserve(self, c: Candidate, dec: Placement, shard: int, klass: Any, victims: tuple[Victim, ...],
                 usage: dict[str, float], batch: TransitionBatch, now: float) -> Decided:
        """Apply the placement to the mirror and queue its reservation: one compare-and-set over every slot."""
        sub = c.submit
        mirror = self.shards.mirrors[shard]
        # the command is planned from this view: preempted jobs' instances show idle in it
        gpu_before = placed_view(mirror.get(dec.slot.gpu_id), victims)
        gang = len(dec.slots) > 1
        views = ({s.gpu_id: placed_view(mirror.get(s.gpu_id), victims) for s in dec.slots}
                 if gang and dec.slot.profile not in PLAIN_PROFILES else {})
        victim_jobs = {v.job_id for v in victims}
        expected = expected_run(sub.duration_hint_s, self.default_hint_s)
        slots: list[SlotReservation] = []
        for s in dec.slots:
            # a gang's member never moves alone (its instance is not migratable)
            inst = reservation_instance(s, sub.job_id, c.priority, sub.tenant, sub.latency_sensitive,
                                        sub.migratable and not gang, now + expected if expected is not None else 0.0)
            if klass is not None:
                inst.pre = klass.preemptible
            ver = mirror.apply(s, sub.job_id, inst, victim_jobs)
            slots.append(SlotReservation(gpu_id=s.gpu_id, expected_ver=ver, instance=inst, action=s.action,
                                         destroy=s.destroy, max_count=self._max_count(s)))
        first = slots[0]
        r = Reservation(
            job_id=sub.job_id, gpu_id=first.gpu_id, expected_ver=first.expected_ver, instance=first.instance,
            action=first.action, destroy=first.destroy, max_count=first.max_count, extra=tuple(slots[1:]),
            span=len({s.node for s in dec.slots}) > 1, track=True, spec=c.spec, prio=c.priority,
            submitted_at=sub.submitted_at,
            reason=dec.explain(runners_up=3)[:1000], traceparent=c.traceparent,
            tenant=sub.tenant if self.ledger.active else "", usage=usage,
            limits=self.ledger.limits(sub.tenant, usage, shard),
            victims=tuple(Eviction(job_id=v.job_id, instance_id=v.instance_ids[0],
                                   reason=f"preempted by {sub.job_id}: {v.detail}"[:500]) for v in victims),
        )
        booked = False
        if self.ledger.active:  # booked now: the next decision of this batch must see it
            split = slot_usages(mirror.snapshot(), dec, sub.demand) if len(dec.slots) > 1 else (usage,)
            booked = self.ledger.charge(sub.job_id, sub.tenant,
                                        {s.gpu_id: u for s, u in zip(dec.slots, split, strict=True)})
            for v in victims:
                self.ledger.uncharge(v.job_id)
        return Decided(c, dec, batch.reserve(r, now),
                       Booking(gpu_before, first.expected_ver, victims, booked, views))

    def _max_count(self, slot: Slot) -> int:
        if slot.profile in PLAIN_PROFILES:
            return 1  # unused: a whole GPU is exclusive, shares are bounded by the GPU's replicas
        return self.geometry.model(slot.model).profile(slot.profile).max_count


def placed_on(dec: Placement) -> list[str]:
    return [s.gpu_id for s in dec.slots]
