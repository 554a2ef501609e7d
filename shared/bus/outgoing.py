"""What a publisher hands the bus, and what the bus answers: the same for every transport."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import msgspec
from opentelemetry import context as otel_context


class Outgoing(NamedTuple):
    """One message to publish: ``msg_id`` defaults to the message's ``id``; ``ctx`` is the trace parent."""

    subject: str
    msg: msgspec.Struct
    ctx: otel_context.Context | None = None
    msg_id: str | None = None


class PublishAck(Protocol):
    """The stream's acknowledgement of one publish: where it is stored, and whether it was a duplicate (a
    republish within the duplicate window, stored once, whose ``seq`` is the first copy's)."""

    @property
    def stream(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def duplicate(self) -> bool | None: ...


class Stored(NamedTuple):
    """A ``PublishAck`` of the in-memory bus."""

    stream: str
    seq: int
    duplicate: bool = False
