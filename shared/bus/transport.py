"""What a transport (JetStream, or the in-memory bus) gives the shared consumer loop: subscriptions that hand
out batches of raw messages, and raw publishing. Decoding, settling and dead-lettering are the loop's
(``shared.bus.consumer``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from shared.events import Subjects
from shared.settings import Settings


class Inbound(Protocol):
    """One message as a transport delivers it."""

    @property
    def subject(self) -> str: ...
    @property
    def data(self) -> bytes: ...
    @property
    def headers(self) -> Mapping[str, str] | None: ...
    @property
    def deliveries(self) -> int: ...
    @property
    def stream_seq(self) -> int: ...
    async def ack(self) -> None: ...
    async def nak(self, delay: float) -> None: ...


class Subscription(Protocol):
    async def next_batch(self, timeout: float) -> list[Any]: ...
    async def stop(self) -> None: ...


class ConsumerSpec(NamedTuple):
    """What a transport needs to make (or find) a consumer on the broker and subscribe to it."""

    stream: str
    name: str
    subject: str
    acks: bool
    max_deliver: int  # the broker's own limit: one above the consumer's, so the consumer dead-letters first
    ack_wait_s: float
    deliver_new: bool
    ephemeral: bool
    batch: int
    linger_s: float
    fetch_timeout_s: float


class ConsumerLead(NamedTuple):
    """Who leads a durable consumer, and how far it has delivered: ``leader`` names the leader's term (the server
    and since when, or, from a server that does not say since when, how many elections this client has seen
    announced; "" while it elects one), ``delivered_seq`` the last stream sequence it has handed out."""

    leader: str
    delivered_seq: int


class StoredMessage(NamedTuple):
    """One message as its stream keeps it: ``at`` is when the stream stored it (seconds since the epoch)."""

    seq: int
    subject: str
    data: bytes
    headers: Mapping[str, str]
    at: float


class Transport(Protocol):
    settings: Settings
    subjects: Subjects

    async def subscribe(self, spec: ConsumerSpec) -> Subscription: ...
    async def publish_raw(self, subject: str, data: bytes, headers: dict[str, str]) -> Any: ...
