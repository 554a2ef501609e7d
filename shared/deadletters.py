"""The dead-letter stream read back: what was refused, why, and putting one message back after a fix.

A consumer that cannot process a message publishes its original bytes to ``dlq.<subject>`` with headers that
say why (``shared.bus.consumer``). This reads them by stream sequence and republishes one on its original
subject, with a new message id so that JetStream's duplicate window does not drop it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import msgspec
from nats.js.errors import NotFoundError

from shared.bus import JetStreamBus
from shared.errors import MigschedError


class DeadLetterError(MigschedError):
    """A dead letter that cannot be read or replayed (unknown sequence, no original subject)."""


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    subject: str
    """Where it was published first (``Migsched-Original-Subject``)."""
    reason: str
    consumer: str
    deliveries: int
    failed_at: float
    size: int
    preview: str
    """The start of the payload as text (JSON messages read as they were sent)."""


def _letter(seq: int, headers: dict[str, str] | None, data: bytes, dlq_subject: str) -> DeadLetter:
    h = headers or {}
    return DeadLetter(
        seq=seq, subject=h.get("Migsched-Original-Subject", dlq_subject), reason=h.get("Migsched-Error", ""),
        consumer=h.get("Migsched-Consumer", ""), deliveries=int(h.get("Migsched-Deliveries", "0") or 0),
        failed_at=float(h.get("Migsched-Failed-At", "0") or 0), size=len(data),
        preview=data[:160].decode("utf-8", errors="replace"),
    )


async def letters(bus: JetStreamBus, limit: int = 100) -> AsyncIterator[DeadLetter]:
    """The newest ``limit`` dead letters, oldest first."""
    stream = bus.subjects.stream_dlq
    try:
        info = await bus.js.stream_info(stream)
    except NotFoundError:
        return
    if not info.state.messages:  # an empty stream reports sequence 0, which no read accepts
        return
    first, last = max(1, info.state.first_seq), info.state.last_seq
    for seq in range(max(first, last - limit + 1), last + 1):
        try:
            m = await bus.js.get_msg(stream, seq=seq)
        except NotFoundError:  # removed (replayed, or aged out) between the info and the read
            continue
        yield _letter(seq, m.headers, m.data or b"", m.subject or "")


async def replay(bus: JetStreamBus, seq: int, keep: bool = False) -> DeadLetter:
    """Publish dead letter ``seq`` again on its original subject; then remove it from the dead-letter stream
    unless ``keep``. Returns what was replayed."""
    stream = bus.subjects.stream_dlq
    try:
        m = await bus.js.get_msg(stream, seq=seq)
    except NotFoundError:
        raise DeadLetterError(f"no dead letter with sequence {seq} in {stream}") from None
    letter = _letter(seq, m.headers, m.data or b"", m.subject or "")
    if not (m.headers or {}).get("Migsched-Original-Subject"):
        raise DeadLetterError(f"dead letter {seq} does not say where it was first published")
    headers = {"Nats-Msg-Id": f"replay:{stream}:{seq}:{time.time():.6f}", "Migsched-Replayed-From": str(seq)}
    await bus.js.publish(letter.subject, m.data or b"", headers=headers)
    if not keep:
        await bus.js.delete_msg(stream, seq)
    return letter
