"""Acknowledgements of asynchronous JetStream publishes, read on one wildcard inbox of a connection."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.js import api

from shared.bus.errors import BusError


class _AckReply(msgspec.Struct):
    """A JetStream publish acknowledgement (or its error) as the server sends it."""

    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    domain: str | None = None
    error: dict[str, Any] | None = None


reply_decoder = msgspec.json.Decoder(_AckReply)
"""Decodes a publish acknowledgement, or any JetStream API reply for its ``error``."""


class PublishAcks:
    """Acknowledgements of asynchronous JetStream publishes on one wildcard inbox of this connection.

    Why not nats-py's ``publish_async``: per message it waits on a semaphore through ``asyncio.wait_for``,
    draws a random token, and decodes the ack with ``json.loads`` and a dataclass walk, about a third of a
    publish's CPU; its futures also never time out, so an ack lost in a reconnect would hold the batch forever.
    Here a publish is a counter token, one dict entry and one msgspec decode; ``wait`` bounds the wait.
    """

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.prefix = ""
        self.futures: dict[str, asyncio.Future[api.PubAck]] = {}
        self._seq = 0
        self._sub: Any = None

    async def _start(self) -> None:
        self.prefix = self.nc.new_inbox() + "."
        self._sub = await self.nc.subscribe(
            self.prefix + "*", cb=self._on_ack, pending_msgs_limit=1_000_000, pending_bytes_limit=64 * 1024 * 1024
        )

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future[api.PubAck]:
        if self._sub is None:
            await self._start()
        self._seq += 1
        token = str(self._seq)
        fut: asyncio.Future[api.PubAck] = asyncio.get_running_loop().create_future()
        self.futures[token] = fut
        try:
            await self.nc.publish(subject, payload, reply=self.prefix + token, headers=headers)
        except BaseException:
            self.futures.pop(token, None)
            raise
        return fut

    async def _on_ack(self, msg: Any) -> None:
        fut = self.futures.pop(msg.subject[len(self.prefix) :], None)
        if fut is None or fut.done():
            return
        if not msg.data:  # a status only: 503 when no stream takes the subject
            status = (msg.headers or {}).get("Status", "no data")
            fut.set_exception(BusError(f"no stream acknowledged a publish: status {status} (no stream takes its "
                                       "subject, or its stream has no leader right now)"))
            return
        try:
            r = reply_decoder.decode(msg.data)
        except msgspec.DecodeError as exc:
            fut.set_exception(BusError(f"unreadable publish acknowledgement: {exc}"))
            return
        if r.error is not None:
            fut.set_exception(BusError(f"publish refused: {r.error}"))
            return
        fut.set_result(api.PubAck(stream=r.stream, seq=r.seq, domain=r.domain, duplicate=r.duplicate))

    def forget(self, futures: Sequence[asyncio.Future[api.PubAck]]) -> None:
        """Drop the entries of futures that will never be answered (timed out)."""
        pending = {id(f) for f in futures if not f.done()}
        if pending:
            for token in [t for t, f in self.futures.items() if id(f) in pending]:
                del self.futures[token]
