"""What a publisher hands the bus, and what the bus answers: the same for every transport; and the count of
what was published, by kind (the publish side of the bus's metrics middleware)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple, Protocol

import msgspec
from opentelemetry import context as otel_context
from prometheus_client import Counter

PUBLISHED = Counter(
    "migsched_messages_published_total",
    "Messages this process published and the stream acknowledged, by kind (a command by its own kind: "
    "Command.place, Command.stop, ...).",
    ["kind"],
)
_children: dict[str, Any] = {}


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


def kind_of(msg: Any) -> str:
    name = type(msg).__name__
    kind = getattr(msg, "kind", None)
    return f"{name}.{kind}" if name == "Command" and isinstance(kind, str) else name


def count_published(msgs: Iterable[Any]) -> None:
    """The publish side of the bus's metrics middleware (the consume side is in ``consumer``)."""
    for msg in msgs:
        kind = kind_of(msg)
        c = _children.get(kind)
        if c is None:
            c = _children[kind] = PUBLISHED.labels(kind)
        c.inc()
