"""The balancer's backfill: queued jobs are tried again when room appears (a job exit, a capacity change, a
re-queue by another service or replica, the periodic sweep). Signals coalesce into one pass per tick over the
head of each shard's queue (priority, then age; with tenancy, fair share between tenants), decided and
committed like fresh submits; a job that waited past its patience is rejected.
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from services.balancer.candidate import Candidate
from services.balancer.decide import Decisions
from services.balancer.preempting import fair_order
from services.common import metrics as m
from shared import telemetry
from shared.events import JobSubmit

_SUBMIT = msgspec.json.Decoder(JobSubmit)



class Backfill(Decisions):
    """The backfill half of ``Balancer``."""

    _backfill_wanted: asyncio.Event

    def request_backfill_now(self, queue_grew: bool = False) -> None:
        self._backfill_wanted.set()
        if queue_grew:
            self._queue_maybe_nonempty = True

    async def request_backfill(self) -> None:
        """The periodic sweep: also catches jobs re-queued by other services or replicas."""
        self.request_backfill_now(queue_grew=True)

    async def _backfill_tick(self) -> None:
        # coalesces every exit/capacity signal of the last tick into one pass over the queue head; skips the
        # pass
        # (a Redis read) while the queue is known to be empty
        if self._backfill_wanted.is_set() and self._queue_maybe_nonempty:
            self._backfill_wanted.clear()
            if await self.backfill() == 0 and await self.state.pending_count() == 0:
                self._queue_maybe_nonempty = False

    async def backfill(self) -> int:
        """Try the head of each shard's queue (priority, then age) on the mirror; return jobs placed."""
        st = self.settings
        placed_before = self.placed
        now = time.time()
        depth = 0
        for shard in range(st.shards):
            ids = await self.state.pending_ids(shard, st.backfill_batch)
            depth += len(ids)
            if not ids:
                if self.reserves and self.holds[shard].current:  # nothing waits: nothing is held
                    self.holds[shard].begin()
                    await self.state.put_holds(shard, self.holds[shard].end(), now)
                continue
            unknown = [j for j in ids if j not in self._waiting]
            records = {j.job_id: j for j in await self.state.jobs(unknown) if j is not None} if unknown else {}
            cands: list[Candidate] = []
            expired = self.state.batch()
            for jid in ids:
                preempted = False
                if jid in self._waiting:
                    sub, spec, ctx = self._waiting[jid]
                    attempts = 0
                else:
                    rec = records.get(jid)
                    if rec is None:
                        continue
                    spec, attempts, preempted = rec.spec, rec.attempts, rec.preempted > 0
                    ctx = telemetry.extract({"traceparent": rec.traceparent}) if rec.traceparent else None
                    try:
                        sub = _SUBMIT.decode(spec)
                    except msgspec.DecodeError:
                        expired.settle(jid, "rejected", "stored spec unreadable", now, ("pending",))
                        continue
                # a preempted job keeps its submit time for its place in the queue, not to run out of patience
                if not preempted and sub.patience_s is not None and now - sub.submitted_at > sub.patience_s:
                    expired.settle(
                        jid,
                        "rejected",
                        f"waited longer than its patience {sub.patience_s:g}s",
                        now,
                        ("pending",),
                    )
                    self._m_outcome["rejected"].inc()
                    self._waiting.pop(jid, None)
                    continue
                # the job's own trace continues from the queue (its traceparent was stored with it)
                cands.append(Candidate(submit=sub, spec=spec, ctx=ctx, from_queue=True, attempt=attempts))
            if len(expired):
                await expired.run()
            async with self.lock:
                if self.ledger.active:  # priority, then fair share between tenants, then age
                    cands = fair_order(self.ledger, self.mirrors[shard].snapshot(), cands)
                self.holds[shard].begin()  # the holds are planned anew in this pass's order
                try:
                    out = await self.decide_and_commit(cands)
                finally:
                    holds = self.holds[shard].end()
            await self.send(out)
            if self.reserves:
                await self.state.put_holds(shard, holds, now)
        m.child(m.QUEUE_DEPTH, self.name).set(depth)
        return self.placed - placed_before
