"""One batch of jobs through the balancer: decide each on the mirror, commit the round in one Redis pipeline of
compare-and-set Lua calls, settle each outcome, and decide the losers again (up to ``max_rounds``).

The outcome of a committed reservation: placed (its command joins the messages to send), a duplicate (a
replayed submit: nothing to do), or a lost race (those GPUs are read again, and the job is decided again next
round). A job still losing after ``max_rounds`` waits in the queue for the next backfill.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from services.balancer import metrics as m
from services.balancer.candidate import Candidate
from services.balancer.decide import Decided, Decider, DecisionMetrics, RoundMemo, placed_on
from services.balancer.dispatch import Dispatcher
from services.balancer.preempting import preemption_events, record_preemptions
from services.balancer.routing import route_for
from services.balancer.shards import Shards
from services.balancer.tenancy import TenantLedger
from services.balancer.waiting import Waiting, trace_wait
from services.common.metric_cache import child
from shared import telemetry
from shared.bus import Outgoing
from shared.events import Placed
from shared.policy.placement.decision import CannotPlace
from shared.ports import StateStore
from shared.state import shard_of


@dataclass(slots=True)
class RoundResult:
    out: list[Outgoing] = field(default_factory=list)
    unplannable: list[Placed] = field(default_factory=list)
    retry: list[Candidate] = field(default_factory=list)
    reload: set[str] = field(default_factory=set)
    route: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per reason (``Decided.route_why``), the new jobs routed to another shard."""
    over_quota: list[tuple[Candidate, str]] = field(default_factory=list)
    """Refused by the store's quota check (another replica's placements took the room): queued with the reason."""


class Pipeline:
    def __init__(self, state: StateStore, shards: Shards, ledger: TenantLedger, decider: Decider,
                 dispatcher: Dispatcher, waiting: Waiting, metrics: DecisionMetrics, max_rounds: int,
                 service: str, log: logging.Logger) -> None:
        self.state = state
        self.shards = shards
        self.ledger = ledger
        self.decider = decider
        self.dispatcher = dispatcher
        self.waiting = waiting
        self.metrics = metrics
        self.max_rounds = max_rounds
        self.service = service
        self.log = log
        self.placed = 0

    async def run(self, cands: list[Candidate]) -> list[Outgoing]:
        """Decide and commit ``cands``; the messages to publish (``Dispatcher.send``). Call under the lock."""
        out: list[Outgoing] = []
        unplannable: list[Placed] = []
        todo = cands
        await self._catch_up(cands)
        await self._route(cands)
        for _round in range(self.max_rounds):
            if not todo:
                break
            now = time.time()
            batch = self.state.batch()
            memo = RoundMemo()
            decided = [d for c in todo if (d := self.decider.decide(c, batch, now, memo)) is not None]
            results: list[Any] = []
            if len(batch):
                with telemetry.step("balancer commit", [d.cand.ctx for d in decided]):
                    results = await batch.run()
            r = RoundResult()
            for d in decided:
                self._settle(d, results, now, r)
            out += r.out
            unplannable += r.unplannable
            await self.shards.reload(self.state, r.reload)
            for reason, wanted in r.route.items():
                await self._send(wanted, reason)
            await self._queue(r.over_quota, now)
            todo = r.retry
        if todo:
            await self._requeue_losers(todo)
        await self.dispatcher.give_back(unplannable)
        return out

    async def _catch_up(self, cands: list[Candidate]) -> None:
        """A gang bigger than a shard's mirror is judged on the shards as Redis holds them now: a node that just
        registered may not be in the mirror yet, and a gang is routed, or rejected for its size, only on every
        GPU ever registered (one read per such shard and batch; such gangs are rare)."""
        short: set[int] = set()
        for c in cands:
            if c.submit.demand.kind != "gpus":
                continue
            # a new job may be routed to any shard; a queued one lives in its own
            look = [self.shards.of_job(c.submit.job_id)] if c.from_queue else range(self.shards.count)
            short.update(s for s in look if c.submit.demand.gpus > len(self.shards.mirrors[s].vers))
        for shard in short:
            known = self.shards.mirrors[shard].vers
            await self.shards.reload(self.state, {g for g in await self.state.gpu_ids(shard) if g not in known})

    async def _route(self, cands: list[Candidate]) -> None:
        """Route each new job its home shard could never host (``routing.route_for``) before anything of it is
        recorded. Others are decided where this process knows they live: a redelivered submit of a job routed
        earlier is answered 'routed' by its home, and decided again in its shard (``Batch``)."""
        if self.shards.count <= 1:
            return
        wanted: dict[str, int] = {}
        for c in cands:
            job = c.submit.job_id
            home = shard_of(job, self.shards.count)
            if c.from_queue or self.state.job_shard(job) != home:
                continue
            target = route_for(self.shards, c.submit, home)
            if target is not None:
                c.routed = True
                wanted[job] = target
        await self._send(wanted, "never_fits")

    async def _send(self, wanted: dict[str, int], reason: str = "no_room_now") -> None:
        """Record where each of these new jobs lives (``StateStore.route``); the first route of a job wins."""
        if not wanted:
            return
        why = {"never_fits": "could never host it", "no_room_now": "cannot place it now",
               "sooner_elsewhere": "would start it later"}[reason]
        for job, shard in (await self.state.route(wanted, time.time())).items():
            home = shard_of(job, self.shards.count)
            if shard != home:
                child(m.ROUTED, reason).inc()
                self.log.info("job %s lives in shard %d: its home shard %d %s", job, shard, home, why)

    def _settle(self, d: Decided, results: list[Any], now: float, r: RoundResult) -> None:
        c, dec = d.cand, d.dec
        if d.route is not None:  # decided again next round, in the shard it is routed to
            r.route.setdefault(d.route_why, {})[c.submit.job_id] = d.route
            r.retry.append(c)
            return
        if isinstance(dec, CannotPlace):
            self.metrics.outcome["pending"].inc()
            self.waiting.queued(c.submit, c.spec, c.ctx, "; ".join(dec.reasons), now)
            if c.delivery is not None:
                c.delivery.span.set_attribute("migsched.decision", dec.explain()[:1000])
            return
        res = results[d.idx]
        booking = d.booking
        assert booking is not None
        wait = self.waiting.left(c.submit.job_id)
        if res.ok:
            if c.from_queue or wait is not None:
                trace_wait(c.ctx, c.submit, wait, now, "placed")
            self._placed(d, int(res.detail or 0), now, r, res.master_addr)
            return
        if wait is not None and res.status != "known":  # it goes on waiting (retried, or queued again)
            self.waiting.waits_on(c.submit.job_id, wait)
        r.reload.update(placed_on(dec))  # also re-derives the quota charges of those GPUs' jobs
        if booking.booked:
            self.ledger.uncharge(c.submit.job_id)
        if res.status == "known":
            self.metrics.outcome["duplicate"].inc()  # a replayed submit: nothing to do
            return
        if res.status == "quota":  # this book had not seen another replica's placements yet: the job waits
            self.metrics.outcome["pending"].inc()
            why = f"quota: {res.detail}"
            self.log.info("reservation of %s refused by the store's quota check: %s", c.submit.job_id, res.detail)
            self.waiting.queued(c.submit, c.spec, c.ctx, why, now)
            r.over_quota.append((c, why))
            return
        m.CONFLICTS.inc()
        self.metrics.outcome["conflict"].inc()
        self.log.debug("reservation of %s lost: %s %s", c.submit.job_id, res.status, res.detail)
        r.retry.append(c)

    def _placed(self, d: Decided, attempt: int, now: float, r: RoundResult, master_addr: str = "") -> None:
        c, dec, booking = d.cand, d.dec, d.booking
        assert booking is not None and not isinstance(dec, CannotPlace)
        self.metrics.outcome["placed"].inc()
        m.placed(c.submit, now, self.ledger.class_name)
        self.placed += 1
        c.attempt = attempt
        victims = booking.victims
        if victims:
            record_preemptions(self.ledger, self.log, c, victims, now)
            for v in victims:
                child(m.PREEMPTIONS, v.tenant).inc()
            self.waiting.request(queue_grew=True)  # the victims wait to run again
            # a victim's instances on GPUs outside this placement (a gang) were freed too
            r.reload.update(g for v in victims for g in v.gpu_ids if g not in placed_on(dec))
        placed = self.dispatcher.placed(c, dec, booking.gpu_before, booking.ver, now)
        if victims:
            placed = msgspec.structs.replace(placed, preempted=tuple(v.job_id for v in victims))
        cmds = self.dispatcher.commands(placed, c, now, master_addr, booking.views)
        if cmds is not None:
            r.out.extend(cmds)
            if victims:  # a victim gang's parts on nodes that no place command goes to
                r.out.extend(self.dispatcher.victim_stops(placed, victims, c, now))
        else:
            r.unplannable.append(placed)
        if victims:  # committed: the victims are re-queued whether or not the command could be planned
            r.out.extend(preemption_events(self.dispatcher.subjects, c, victims, attempt, now))
        if c.delivery is not None:
            sp = c.delivery.span
            sp.set_attribute("migsched.decision", dec.explain()[:1000])
            sp.set_attribute("migsched.gpu", dec.slot.gpu_id)
            sp.set_attribute("migsched.frag_after", dec.frag_after)

    async def _queue(self, jobs: list[tuple[Candidate, str]], now: float) -> None:
        """Record these jobs as pending with their reasons (a new one gets its record here)."""
        if not jobs:
            return
        b = self.state.batch()
        for c, why in jobs:
            b.enqueue(c.submit.job_id, c.spec, c.priority, c.submit.submitted_at, why[:1000], now, c.traceparent)
        await b.run()

    async def _requeue_losers(self, todo: list[Candidate]) -> None:
        """Still losing races after ``max_rounds``: wait in the queue, the next backfill tries again."""
        b = self.state.batch()
        for c in todo:
            b.enqueue(c.submit.job_id, c.spec, c.priority, c.submit.submitted_at,
                      f"lost {self.max_rounds} compare-and-set races", time.time(), c.traceparent)
        await b.run()
        self.waiting.request(queue_grew=True)
