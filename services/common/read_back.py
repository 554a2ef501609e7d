"""Messages a durable consumer went past without delivering them, read back from the stream after a change of
its leader.

A replicated consumer of a nats-server before 2.11 can skip a message when its leader changes
(``shared.bus.server_version``). ``ReadBack`` asks who leads the consumer every few seconds (the leader's term: a
leader that moved away and back reads as a change, ``shared.bus.elections``). After a change, once ``grace_s`` has
passed (any redelivery due by then has come), it reads back the messages stored from a grace before the last look
that saw the old leader up to what the consumer has delivered; a message past the delivered sequence is the
consumer's to deliver. The caller keeps those its state shows were never applied. Services run it only while
``MIGSCHED_STREAM_REPLICAS`` is above 1: a consumer of one copy lives on one server, and its leader never changes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from shared.bus.transport import StoredMessage
from shared.events import DecodeError, JobCancel, JobSubmit, decode
from shared.ports import EventBus

LEAD_POLL_S = 5.0
"""How often the consumer's leader is asked for: one small API request per process."""
READ_LIMIT = 100_000
"""The most messages one look reads back (a window of a few minutes at 500 jobs/s)."""

log = logging.getLogger("migsched.bus")


class ReadMessage(NamedTuple):
    data: Any
    """The message, decoded and validated."""
    stored: StoredMessage


class ReadBack:
    """Watches one durable consumer's leader, and reads back what it may have skipped across a change."""

    def __init__(self, bus: EventBus, stream: str, durable: str, subject: str, grace_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.bus = bus
        self.stream, self.durable, self.subject = stream, durable, subject
        self.grace_s = grace_s
        self.clock = clock
        self._leader: str | None = None
        self._looked_at = 0.0
        self._due: tuple[float, float] | None = None
        """(when to read back, from when): the pending look after a change of leader."""

    async def poll(self) -> list[ReadMessage]:
        """Note the leader; when a look back is due, every message of the window (usually none is due)."""
        lead = await self.bus.consumer_lead(self.stream, self.durable)
        now = self.clock()
        if lead is None:  # not made yet: nothing was delivered, so nothing can have been skipped
            return []
        if self._leader is not None and lead.leader != self._leader:
            since = self._looked_at - self.grace_s
            if self._due is not None:
                since = min(since, self._due[1])
            self._due = (now + self.grace_s, since)
            log.info("consumer %s changed leader (%s -> %s): what it delivered since %.3f is read back at %.3f",
                     self.durable, self._leader or "none", lead.leader or "none", since, now + self.grace_s)
        self._leader, self._looked_at = lead.leader, now
        if self._due is None or now < self._due[0]:
            return []
        since, self._due = self._due[1], None
        stored = await self.bus.stored(self.stream, self.subject, since, lead.delivered_seq, READ_LIMIT)
        if len(stored) >= READ_LIMIT:
            log.warning("reading back %s: the first %d messages since %.3f only", self.subject, READ_LIMIT, since)
        out: list[ReadMessage] = []
        for m in stored:
            try:
                out.append(ReadMessage(decode(m.subject, m.data, self.bus.subjects), m))
            except DecodeError:
                # nothing to apply: the consumer dead-letters such a message when it delivers it; one it skipped
                # stays in the stream only (``migsched dlq`` does not list it)
                continue
        return out

    async def by_job(self, kind: type[JobSubmit | JobCancel]) -> dict[str, ReadMessage]:
        """``poll``'s messages of ``kind``, the first of each job."""
        found: dict[str, ReadMessage] = {}
        for m in await self.poll():
            if isinstance(m.data, kind):
                found.setdefault(m.data.job_id, m)
        return found
