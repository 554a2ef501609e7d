"""The balancer's backfill: queued jobs are tried again when room appears (a job exit, a capacity change, a
re-queue by another service or replica, the periodic sweep). Signals coalesce into one pass per tick over the
head of each shard's queue (priority, then age; with tenancy, fair share between tenants), decided and
committed like fresh submits; a job that waited past its patience is rejected. A job re-queued after a refused
placement waits out its back-off first (``retry_wait``), so the state heals before the same slot is chosen
again. With a policy that reserves, each pass plans the holds anew and stores them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from services.balancer.candidate import Candidate
from services.balancer.decide import DecisionMetrics
from services.balancer.dispatch import Dispatcher
from services.balancer.pipeline import Pipeline
from services.balancer.preempting import fair_order
from services.balancer.shards import Shards
from services.balancer.tenancy import TenantLedger
from services.balancer.waiting import Waiting, trace_wait
from shared import telemetry
from shared.events import JobSubmit
from shared.ports import StateStore, TransitionBatch
from shared.settings import BalancerSettings

_SUBMIT = msgspec.json.Decoder(JobSubmit)


def retry_wait(requeues: int, base_s: float, cap_s: float) -> float:
    """How long a job re-queued ``requeues`` times (preemptions not counted) waits before it is decided again."""
    if requeues <= 0 or base_s <= 0:
        return 0.0
    return min(cap_s, base_s * 2.0 ** min(requeues - 1, 30))


class Backfill:
    def __init__(self, settings: BalancerSettings, state: StateStore, shards: Shards, ledger: TenantLedger,
                 pipeline: Pipeline, dispatcher: Dispatcher, waiting: Waiting, metrics: DecisionMetrics,
                 reserves: bool, lock: asyncio.Lock, service: str) -> None:
        self.settings = settings
        self.state = state
        self.shards = shards
        self.ledger = ledger
        self.pipeline = pipeline
        self.dispatcher = dispatcher
        self.waiting = waiting
        self.metrics = metrics
        self.reserves = reserves
        self.lock = lock
        self.service = service

    async def tick(self) -> None:
        """One pass if one was asked for since the last tick (skipped while the queue is known to be empty)."""
        if self.waiting.take_request() and await self.run() == 0 and await self.state.pending_count() == 0:
            self.waiting.maybe_nonempty = False

    async def run(self) -> int:
        """Try the head of each shard's queue (priority, then age) on the mirror; return jobs placed."""
        placed_before = self.pipeline.placed
        now = time.time()
        depth = 0
        for shard in range(self.shards.count):
            ids = await self.state.pending_ids(shard, self.settings.backfill_batch)
            depth += len(ids)
            holds = self.shards.holds[shard]
            backlog = self.shards.backlogs[shard]
            if not ids:
                backlog.reset((), ())
                if self.reserves and holds.current:  # nothing waits: nothing is held
                    holds.begin()
                    await self.state.put_holds(shard, holds.end(), now)
                continue
            cands = await self._candidates(ids, now)
            async with self.lock:
                if backlog.kept:
                    backlog.reset((c.submit for c in cands), self.shards.mirrors[shard].view().model_list)
                if self.ledger.active:  # priority, then fair share between tenants, then age
                    cands = fair_order(self.ledger, self.shards.mirrors[shard].snapshot(), cands)
                holds.begin()  # the holds are planned anew in this pass's order
                try:
                    out = await self.pipeline.run(cands)
                finally:
                    planned = holds.end()
            await self.dispatcher.send(out)
            if self.reserves:
                await self.state.put_holds(shard, planned, now)
        return self.pipeline.placed - placed_before

    async def _candidates(self, ids: list[str], now: float) -> list[Candidate]:
        """The queued jobs as candidates, in queue order; the unreadable and the impatient are rejected."""
        known = self.waiting.specs
        st = self.settings
        unknown = [j for j in ids if j not in known]
        records = {j.job_id: j for j in await self.state.jobs(unknown) if j is not None} if unknown else {}
        cands: list[Candidate] = []
        expired = self.state.batch()
        for jid in ids:
            preempted = False
            if jid in known:
                sub, spec, ctx = known[jid]
                attempts = 0
            else:
                rec = records.get(jid)
                if rec is None:
                    continue
                spec, attempts, preempted = rec.spec, rec.attempts, rec.preempted > 0
                if now - rec.updated < retry_wait(rec.attempts - rec.preempted, st.retry_backoff_s,
                                                  st.retry_backoff_max_s):
                    continue  # the periodic sweep tries it again
                ctx = telemetry.extract({"traceparent": rec.traceparent}) if rec.traceparent else None
                try:
                    sub = _SUBMIT.decode(spec)
                except msgspec.DecodeError:
                    expired.settle(jid, "rejected", "stored spec unreadable", now, ("pending",))
                    continue
            if self._out_of_patience(sub, ctx, preempted, now, expired):
                continue
            # the job's own trace continues from the queue (its traceparent was stored with it)
            cands.append(Candidate(submit=sub, spec=spec, ctx=ctx, from_queue=True, attempt=attempts))
        if len(expired):
            await expired.run()
        return cands

    def _out_of_patience(self, sub: JobSubmit, ctx: Any, preempted: bool, now: float,
                         expired: TransitionBatch) -> bool:
        # a preempted job keeps its submit time for its place in the queue, not to run out of patience
        if preempted or sub.patience_s is None or now - sub.submitted_at <= sub.patience_s:
            return False
        expired.settle(sub.job_id, "rejected", f"waited longer than its patience {sub.patience_s:g}s", now,
                       ("pending",))
        self.metrics.outcome["rejected"].inc()
        trace_wait(ctx, sub, self.waiting.left(sub.job_id), now, "rejected: waited longer than its patience")
        return True
