"""A pull consumer that keeps requests outstanding, so messages stream in while the handler works.

Why not nats-py's ``fetch(batch, timeout)``: when it finds nothing buffered it sends one request with
``expires``
and then waits for the *whole batch* (or the timeout) before returning, so an idle consumer adds up to the
fetch
timeout to every hop. Here pull requests for ``batch`` messages each stay open for ``expires_s`` and are
renewed
while fewer than ``batch`` are outstanding; ``next_batch`` returns as soon as one message is there, with every
message already buffered (up to ``batch``). Flow control stays with the server: at most ``batch`` x 2 messages
are
requested at a time, and ``max_ack_pending`` bounds what is in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg


class Puller:
    def __init__(
        self, nc: NATS, stream: str, consumer: str, batch: int, expires_s: float = 5.0, linger_s: float = 0.0
    ) -> None:
        self.nc = nc
        self.linger_s = linger_s
        self.api = f"{'$JS.API'}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.batch = batch
        self.expires_s = expires_s
        self.inbox = nc.new_inbox()
        self._buf: deque[Msg] = deque()
        self._ready = asyncio.Event()
        self._requests: deque[list[float]] = deque()  # [expires at (monotonic), messages still owed]
        self._sub: Any = None
        self._reconnects = self._reconnect_count()

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
        if status is None and not msg.data and msg.headers and "Status" in msg.headers:
            status = msg.headers["Status"]
        if status:
            if status in ("408", "409", "404") and self._requests:
                self._requests.popleft()  # that request is over (expired, or refused)
            return
        if self._requests:
            self._requests[0][1] -= 1
            if self._requests[0][1] <= 0:
                self._requests.popleft()
        self._buf.append(msg)
        self._ready.set()

    def _reconnect_count(self) -> int:
        stats = getattr(self.nc, "stats", None)
        return int(stats.get("reconnects", 0)) if isinstance(stats, dict) else 0

    def _owed(self) -> int:
        now = time.monotonic()
        n = self._reconnect_count()
        if n != self._reconnects:
            # A restarted server forgot our pull requests: counting them as owed until they would have expired
            # left the consumer deaf for up to ``expires_s`` after every reconnect (heartbeats unread, nodes
            # declared lost). Ask again; a server that did keep them only sends at most one batch more.
            self._reconnects = n
            self._requests.clear()
        while self._requests and self._requests[0][0] <= now:
            self._requests.popleft()
        return int(sum(r[1] for r in self._requests))

    async def _top_up(self) -> None:
        if self._owed() < self.batch:
            req = {"batch": self.batch, "expires": int(self.expires_s * 1e9)}
            # a little before the server does, so we never count on an expired request
            self._requests.append([time.monotonic() + self.expires_s * 0.9, float(self.batch)])
            await self.nc.publish(self.api, json.dumps(req).encode(), reply=self.inbox)

    async def next_batch(self, timeout: float) -> list[Msg]:
        """Up to ``batch`` messages as soon as at least one is there (and ``linger_s`` more, unless a whole
        batch is); [] after ``timeout`` without any."""
        await self._top_up()
        if not self._buf:
            self._ready.clear()
            try:
                # a timeout scope, not ``asyncio.wait_for``: on Python 3.11 that wraps the wait in a new Task,
                # one per batch fetched by every consumer
                async with asyncio.timeout(timeout):
                    await self._ready.wait()
            except TimeoutError:
                return []
        if self.linger_s > 0 and len(self._buf) < self.batch:
            # a short wait for the rest of a burst: one handler call, one Redis round trip and one flush for
            # several messages instead of one each, at the price of up to ``linger_s`` more per hop. Also when
            # messages were already waiting: lingering only after an idle wait saved nothing measurable (500/s:
            # 204.7 vs 203.0 CPU-s without a linger), lingering always 5-6 %
            await asyncio.sleep(self.linger_s)
        out: list[Msg] = []
        while self._buf and len(out) < self.batch:
            out.append(self._buf.popleft())
        return out
