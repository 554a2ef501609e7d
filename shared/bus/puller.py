"""A JetStream pull subscription that keeps requests outstanding, so messages stream in while the handler works.

Why not nats-py's ``fetch(batch, timeout)``: when it finds nothing buffered it sends one request with ``expires``
and then waits for the *whole batch* (or the timeout) before returning, so an idle consumer adds up to the fetch
timeout to every hop. Here pull requests for ``batch`` messages each stay open for ``expires_s`` and are renewed
while fewer than ``batch`` are outstanding; ``next_batch`` returns as soon as one message is there, with every
message already buffered (up to ``batch``). Flow control stays with the server: at most ``batch`` x 2 messages are
requested at a time, and ``max_ack_pending`` bounds what is in flight.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import deque
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared.bus.inbox import Inbox
from shared.bus.transport import StoredMessage


class PullRequests:
    """The pull requests a subscription has outstanding, and so how many messages the server still owes it."""

    def __init__(self, batch: int, expires_s: float, reconnects: int = 0) -> None:
        self.batch = batch
        self.expires_s = expires_s
        self._reconnects = reconnects
        self._open: deque[list[float]] = deque()  # [expires at (monotonic), messages still owed]

    def owed(self, reconnects: int, now: float) -> int:
        if reconnects != self._reconnects:
            # A restarted server forgot our pull requests: counting them as owed until they would have expired
            # left the consumer deaf for up to ``expires_s`` after every reconnect (heartbeats unread, nodes
            # declared lost). Ask again; a server that did keep them only sends at most one batch more.
            self._reconnects = reconnects
            self._open.clear()
        while self._open and self._open[0][0] <= now:
            self._open.popleft()
        return int(sum(r[1] for r in self._open))

    def should_ask(self, reconnects: int, now: float) -> bool:
        """True when fewer than a batch is owed; the caller then sends one request and this counts it."""
        if self.owed(reconnects, now) >= self.batch:
            return False
        # a little before the server does, so we never count on an expired request
        self._open.append([now + self.expires_s * 0.9, float(self.batch)])
        return True

    def delivered(self) -> None:
        if self._open:
            self._open[0][1] -= 1
            if self._open[0][1] <= 0:
                self._open.popleft()

    def ended(self) -> None:
        """The oldest request is over: expired, or refused by the server."""
        if self._open:
            self._open.popleft()


class Puller:
    def __init__(
        self, nc: NATS, stream: str, consumer: str, batch: int, expires_s: float = 5.0, linger_s: float = 0.0
    ) -> None:
        self.nc = nc
        self.api = f"{'$JS.API'}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.batch = batch
        self.expires_s = expires_s
        self.inbox = nc.new_inbox()
        self.buffer: Inbox[Msg] = Inbox(batch, linger_s)
        self.requests = PullRequests(batch, expires_s, self._reconnect_count())
        self._request = json.dumps({"batch": batch, "expires": int(expires_s * 1e9)}).encode()
        self._sub: Any = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(
            self.inbox, cb=self._on_msg, pending_msgs_limit=1_000_000, pending_bytes_limit=512 * 1024 * 1024
        )

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):  # the connection is gone already
                await self._sub.unsubscribe()

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status:
            if status in ("408", "409", "404"):
                self.requests.ended()
            return
        self.requests.delivered()
        self.buffer.put(msg)

    def _reconnect_count(self) -> int:
        stats = getattr(self.nc, "stats", None)
        return int(stats.get("reconnects", 0)) if isinstance(stats, dict) else 0

    async def next_batch(self, timeout: float) -> list[Msg]:
        if self.requests.should_ask(self._reconnect_count(), time.monotonic()):
            await self.nc.publish(self.api, self._request, reply=self.inbox)
        return await self.buffer.next_batch(timeout)

    async def read_stored(self, up_to_seq: int, limit: int) -> list[StoredMessage]:
        """What a consumer without acks delivers, as its stream stored it, up to stream sequence ``up_to_seq`` and
        at most ``limit`` messages, until a second passes with nothing more."""
        out: list[StoredMessage] = []
        while len(out) < limit:
            msgs = await self.next_batch(1.0)
            if not msgs:
                break
            for m in msgs:
                meta = m.metadata
                seq = int(meta.sequence.stream)
                if seq > up_to_seq or len(out) >= limit:
                    return out
                out.append(StoredMessage(seq, m.subject, m.data, m.headers or {}, meta.timestamp.timestamp()))
        return out
