"""The event bus in one process: JetStream's semantics without a server, for unit tests and in-process tools.

It keeps what the services rely on, and ``tests/contract/`` checks each against NATS:
- streams take the subjects of ``Subjects.streams()``; a publish that no stream takes is refused;
- a message id seen within the duplicate window is stored once, and its acknowledgement says ``duplicate``;
- a durable consumer is shared: replicas binding the same name split the messages; an ephemeral one sees every
  message published after it was made;
- an unacknowledged message comes back after ``ack_wait``, a nak'd one after its delay, until the consumer's
  delivery limit; a consumer without acks forgets each message once delivered;
- a durable consumer has a leader (``elect`` moves it) and a delivered sequence, and the stream's messages can be
  read back from a time on; ``skip`` moves a consumer past a message it never delivered, as a replicated
  consumer of nats-server before 2.11 can after its leader changes (``shared.bus.server_version``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared import telemetry
from shared.bus.consumer import Consumer, Handler
from shared.bus.errors import BusError
from shared.bus.health import BusHealth
from shared.bus.outgoing import Outgoing, Stored, count_published
from shared.bus.transport import ConsumerLead, ConsumerSpec, StoredMessage
from shared.events import Subjects, encode
from shared.settings import Settings


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` one or more."""
    pt, st = pattern.split("."), subject.split(".")
    for i, p in enumerate(pt):
        if p == ">":
            return len(st) > i
        if i >= len(st) or (p != "*" and p != st[i]):
            return False
    return len(pt) == len(st)


@dataclass(frozen=True, slots=True)
class _Entry:
    seq: int
    subject: str
    data: bytes
    headers: Mapping[str, str]
    at: float  # when it was stored, seconds since the epoch


@dataclass(slots=True)
class _Stream:
    name: str
    subjects: list[str]
    entries: list[_Entry] = field(default_factory=list)
    seen: dict[str, tuple[int, float]] = field(default_factory=dict)  # msg id -> (seq, stored at)
    consumers: dict[str, _ConsumerState] = field(default_factory=dict)

    def takes(self, subject: str) -> bool:
        return any(matches(p, subject) for p in self.subjects)


@dataclass(slots=True)
class _ConsumerState:
    """The broker's side of one consumer: where it is in the stream and what it has not had acknowledged."""

    stream: _Stream
    spec: ConsumerSpec
    clock: Callable[[], float]
    cursor: int = 0  # index of the next entry never delivered
    delivered_seq: int = 0  # the last stream sequence handed out
    term: int = 1  # the leader's term: ``MemoryBus.elect`` starts a new one
    deliveries: dict[int, int] = field(default_factory=dict)  # seq -> times delivered, while unacknowledged
    due: dict[int, float] = field(default_factory=dict)  # seq -> when it may be delivered again
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def take(self, n: int) -> list[MemoryMessage]:
        now = self.clock()
        out: list[MemoryMessage] = []
        for seq, at in sorted(self.due.items(), key=lambda kv: kv[1]):
            if len(out) >= n or at > now:
                break
            if self.deliveries[seq] >= self.spec.max_deliver:  # the broker gives up on it
                del self.due[seq], self.deliveries[seq]
                continue
            out.append(self._deliver(self.stream.entries[seq - 1], now))
        while len(out) < n and (e := self.advance()) is not None:
            out.append(self._deliver(e, now))
        return out

    def advance(self) -> _Entry | None:
        """Move the cursor past the next entry of the consumer's subject, and return it (None: none is left)."""
        entries = self.stream.entries
        while self.cursor < len(entries):
            e = entries[self.cursor]
            self.cursor += 1
            if matches(self.spec.subject, e.subject):
                return e
        return None

    def _deliver(self, e: _Entry, now: float) -> MemoryMessage:
        self.delivered_seq = max(self.delivered_seq, e.seq)
        if not self.spec.acks:
            return MemoryMessage(self, e, 1)
        n = self.deliveries.get(e.seq, 0) + 1
        self.deliveries[e.seq] = n
        self.due[e.seq] = now + self.spec.ack_wait_s
        return MemoryMessage(self, e, n)

    def next_due(self) -> float | None:
        return min(self.due.values(), default=None)

    def settle(self, seq: int, again_in: float | None) -> None:
        if seq not in self.deliveries:
            return
        if again_in is None:
            del self.deliveries[seq], self.due[seq]
            return
        self.due[seq] = self.clock() + again_in
        self.wake.set()


class MemoryMessage:
    __slots__ = ("_state", "deliveries", "entry")

    def __init__(self, state: _ConsumerState, entry: _Entry, deliveries: int) -> None:
        self._state = state
        self.entry = entry
        self.deliveries = deliveries

    @property
    def subject(self) -> str:
        return self.entry.subject

    @property
    def data(self) -> bytes:
        return self.entry.data

    @property
    def headers(self) -> Mapping[str, str]:
        return self.entry.headers

    @property
    def stream_seq(self) -> int:
        return self.entry.seq

    async def ack(self) -> None:
        self._state.settle(self.entry.seq, None)

    async def nak(self, delay: float) -> None:
        self._state.settle(self.entry.seq, max(0.0, delay))


class MemorySubscription:
    def __init__(self, state: _ConsumerState) -> None:
        self.state = state
        self.stopped = False

    async def next_batch(self, timeout: float) -> list[MemoryMessage]:
        st = self.state
        deadline = st.clock() + timeout
        while True:
            got = st.take(st.spec.batch)
            if got:
                if st.spec.linger_s > 0 and len(got) < st.spec.batch:
                    await asyncio.sleep(st.spec.linger_s)
                    got += st.take(st.spec.batch - len(got))
                return got
            now = st.clock()
            if now >= deadline or self.stopped:
                return []
            due = st.next_due()
            wait = deadline - now if due is None else min(deadline - now, max(0.0, due - now))
            st.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await st.wake.wait()

    async def stop(self) -> None:
        self.stopped = True
        self.state.wake.set()


class MemoryBus:
    """The ``EventBus`` of one namespace in this process."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.subjects = Subjects(settings.namespace)
        self.health = BusHealth()
        self.clock = clock
        self.streams: dict[str, _Stream] = {}
        self.closed = False
        self.sent: list[tuple[str, bytes, Mapping[str, str]]] = []
        """Every publish the streams accepted, duplicates included, in order: what a test reads to see what a
        service said (the streams themselves keep one copy of a duplicate, as JetStream does)."""

    # --- streams --------------------------------------------------------------------------------------------
    async def ensure_streams(self) -> None:
        for name, subjects in self.subjects.streams().items():
            self.streams.setdefault(name, _Stream(name, subjects))

    async def delete_streams(self) -> None:
        for name in self.subjects.streams():
            self.streams.pop(name, None)

    async def close(self) -> None:
        self.closed = True

    # --- publishing -----------------------------------------------------------------------------------------
    def _store(self, subject: str, data: bytes, headers: Mapping[str, str]) -> Stored:
        if self.closed:
            raise BusError(f"publish to {subject} failed: the bus is closed")
        stream = next((s for s in self.streams.values() if s.takes(subject)), None)
        if stream is None:
            raise BusError(f"no stream acknowledged {subject}: status 503")
        self.sent.append((subject, data, headers))
        now = self.clock()
        window = min(self.settings.duplicate_window_s, self.settings.stream_max_age_s)
        msg_id = headers.get("Nats-Msg-Id")
        if msg_id:
            known = stream.seen.get(msg_id)
            if known is not None and now - known[1] < window:
                return Stored(stream.name, known[0], True)
        seq = len(stream.entries) + 1
        stream.entries.append(_Entry(seq, subject, data, dict(headers), time.time()))
        if msg_id:
            stream.seen[msg_id] = (seq, now)
        for c in stream.consumers.values():
            c.wake.set()
        return Stored(stream.name, seq, False)

    async def publish(
        self,
        subject: str,
        msg: Any,
        *,
        ctx: Any = None,
        msg_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Stored:
        h: dict[str, str] = {"Nats-Msg-Id": msg_id or msg.id}
        telemetry.inject(h, ctx)
        h.update(headers or {})
        stored = self._store(subject, encode(msg), h)
        count_published((msg,))
        return stored

    async def publish_batch(self, items: Sequence[Outgoing]) -> list[Stored]:
        return [await self.publish(it.subject, it.msg, ctx=it.ctx, msg_id=it.msg_id) for it in items]

    async def publish_raw(self, subject: str, data: bytes, headers: dict[str, str]) -> Stored:
        return self._store(subject, data, headers)

    # --- consumers ------------------------------------------------------------------------------------------
    def consumer(self, stream: str, durable: str, subject: str, handler: Handler, **options: Any) -> Consumer:
        return Consumer(self, stream, durable, subject, handler, **options)

    def command_consumer(self, node: str, handler: Handler, **options: Any) -> Consumer:
        return self.consumer(self.subjects.stream_cmd, f"executor-{node}", self.subjects.cmd(node), handler,
                             **options)

    async def subscribe(self, spec: ConsumerSpec) -> MemorySubscription:
        stream = self.streams.get(spec.stream)
        if stream is None:
            raise BusError(f"stream {spec.stream} not found")
        state = stream.consumers.get(spec.name)
        if state is None:
            state = _ConsumerState(stream, spec, self.clock)
            if spec.deliver_new:
                state.cursor = len(stream.entries)
            stream.consumers[spec.name] = state
        return MemorySubscription(state)

    async def delete_consumer(self, stream: str, durable: str) -> None:
        s = self.streams.get(stream)
        if s is not None:
            s.consumers.pop(durable, None)

    async def consumer_lead(self, stream: str, durable: str) -> ConsumerLead | None:
        s = self.streams.get(stream)
        state = s.consumers.get(durable) if s is not None else None
        if state is None:
            return None
        return ConsumerLead(f"memory@{state.term}", state.delivered_seq)

    async def stored(self, stream: str, subject: str, since: float, up_to_seq: int,
                     limit: int) -> list[StoredMessage]:
        s = self.streams.get(stream)
        if s is None:
            raise BusError(f"cannot read {subject} on {stream}: stream {stream} not found")
        hits = (e for e in s.entries if e.seq <= up_to_seq and e.at >= since and matches(subject, e.subject))
        return [StoredMessage(e.seq, e.subject, e.data, e.headers, e.at) for e in itertools.islice(hits, limit)]

    # --- what a replicated consumer of an older nats-server can do ------------------------------------------
    def elect(self, stream: str, durable: str) -> None:
        """The consumer gets a new leader."""
        self.streams[stream].consumers[durable].term += 1

    def skip(self, stream: str, durable: str) -> int:
        """Move the consumer past the next message it would deliver, as though it had been delivered and acked;
        its stream sequence (0: nothing to skip)."""
        state = self.streams[stream].consumers[durable]
        e = state.advance()
        if e is None:
            return 0
        state.delivered_seq = max(state.delivered_seq, e.seq)
        return e.seq
