"""Submits the stream stored that the balancer's durable consumer went past without delivering them.

A replicated consumer of a nats-server before 2.11 can skip a message when its leader changes
(``shared.bus.server_version``). An executor's exit skipped that way comes back in its heartbeats, a place
command's placement times out, but a skipped submit leaves nothing behind: no record, no command, no time-out.
So the balancer asks who leads ``balancer-submit`` every few seconds. After a change, once twice the ack wait has
passed (any redelivery due by then has come), it reads back the submits stored from a grace before the last look
that saw the old leader up to what the consumer has delivered, and hands on each whose job the state does not
know: a job it placed, queued, rejected or saw cancelled has a record. A submit the consumer has not reached yet
is past its delivered sequence and left to it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NamedTuple

from shared.events import DecodeError, JobSubmit, decode
from shared.ports import EventBus, StateStore

LEAD_POLL_S = 5.0
"""How often the consumer's leader is asked for: one small API request per replica."""
READ_LIMIT = 100_000
"""The most submits one look reads back (a window of a few minutes at 500 jobs/s)."""

log = logging.getLogger("migsched.balancer")


class Missed(NamedTuple):
    submit: JobSubmit
    spec: bytes
    headers: dict[str, str]


class MissedSubmits:
    """Watches one durable consumer's leader and finds the submits it skipped across a change."""

    def __init__(self, bus: EventBus, state: StateStore, stream: str, durable: str, subject: str,
                 grace_s: float, clock: Callable[[], float] = time.time) -> None:
        self.bus, self.state = bus, state
        self.stream, self.durable, self.subject = stream, durable, subject
        self.grace_s = grace_s
        self.clock = clock
        self._leader: str | None = None
        self._looked_at = 0.0
        self._due: tuple[float, float] | None = None
        """(when to read back, from when): the pending look after a change of leader."""

    async def poll(self) -> list[Missed]:
        """Note the leader; when a look back is due, the submits the consumer skipped (usually none)."""
        lead = await self.bus.consumer_lead(self.stream, self.durable)
        now = self.clock()
        if lead is None:  # not made yet: nothing was delivered, so nothing can have been skipped
            return []
        if self._leader is not None and lead.leader != self._leader:
            since = self._looked_at - self.grace_s
            if self._due is not None:
                since = min(since, self._due[1])
            self._due = (now + self.grace_s, since)
            log.info("consumer %s changed leader (%s -> %s): its submits since %.3f are read back at %.3f",
                     self.durable, self._leader or "none", lead.leader or "none", since, now + self.grace_s)
        self._leader, self._looked_at = lead.leader, now
        if self._due is None or now < self._due[0]:
            return []
        since, self._due = self._due[1], None
        return await self._unknown(since, lead.delivered_seq)

    async def _unknown(self, since: float, up_to_seq: int) -> list[Missed]:
        stored = await self.bus.stored(self.stream, self.subject, since, up_to_seq, READ_LIMIT)
        if len(stored) >= READ_LIMIT:
            log.warning("reading back %s: the first %d submits since %.3f only", self.subject, READ_LIMIT, since)
        found: dict[str, Missed] = {}
        for m in stored:
            try:
                sub = decode(m.subject, m.data, self.bus.subjects)
            except DecodeError:
                continue  # the consumer dead-letters what does not decode: nothing here to decide
            if isinstance(sub, JobSubmit):
                found.setdefault(sub.job_id, Missed(sub, m.data, dict(m.headers)))
        if not found:
            return []
        ids = list(found)
        records = await self.state.jobs(ids)
        return [found[j] for j, rec in zip(ids, records, strict=True) if rec is None]
