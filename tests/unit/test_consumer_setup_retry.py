"""A service's consumers are set up through a busy JetStream: on a cluster under load one API request can time out
(a replicated consumer waits for its peers). Set-up asks again, as it does for the streams, rather than let the
service exit at start-up."""

from __future__ import annotations

from typing import Any

import nats.errors
import pytest
from nats.js import api
from nats.js.errors import NotFoundError

from shared.bus.jetstream import JetStreamBus
from shared.bus.transport import ConsumerSpec

pytestmark = pytest.mark.unit


class BusyJetStream:
    """Times out the first ``busy`` API requests, then answers as a server without the consumer would."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.added: list[str] = []

    def _maybe_busy(self) -> None:
        if self.busy:
            self.busy -= 1
            raise nats.errors.TimeoutError

    async def consumer_info(self, stream: str, name: str) -> Any:
        self._maybe_busy()
        if name not in self.added:
            raise NotFoundError
        return name

    async def add_consumer(self, stream: str, cfg: api.ConsumerConfig) -> None:
        self._maybe_busy()
        self.added.append(cfg.durable_name or cfg.name or "")


SPEC = ConsumerSpec(stream="JOBS", name="balancer-submit", subject="jobs.submit", acks=True, max_deliver=6,
                    ack_wait_s=30.0, deliver_new=False, ephemeral=False, batch=64, linger_s=0.0,
                    fetch_timeout_s=0.05)


async def test_a_durable_consumer_is_created_once_jetstream_answers_after_timeouts() -> None:
    bus = JetStreamBus.__new__(JetStreamBus)
    bus.js = BusyJetStream(busy=2)  # type: ignore[assignment]
    cfg = api.ConsumerConfig(durable_name=SPEC.name, filter_subject=SPEC.subject)
    await bus._retrying("setting up consumer", lambda: bus._ensure_consumer(SPEC, cfg))
    assert bus.js.added == [SPEC.name]  # type: ignore[attr-defined]
    await bus._retrying("setting up consumer", lambda: bus._ensure_consumer(SPEC, cfg))  # found: kept
    assert bus.js.added == [SPEC.name]  # type: ignore[attr-defined]
