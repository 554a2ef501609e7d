"""Two services setting up the same stream at once: the one that loses the race keeps the winner's stream,
whatever words the server uses to refuse its create; a create refused for a stream that is not there fails."""

from __future__ import annotations

from typing import Any

import pytest
from nats.js import api
from nats.js.errors import BadRequestError, NotFoundError

from shared.bus.errors import BusError
from shared.bus.jetstream import JetStreamBus

pytestmark = pytest.mark.unit
OVERLAP = "subjects overlap with an existing stream"


class _RacedJetStream:
    """Not there when first asked; the create is refused; there afterwards only if ``won`` (another service)."""

    def __init__(self, won: bool) -> None:
        self.won, self.asked = won, 0

    async def stream_info(self, name: str) -> object:
        self.asked += 1
        if self.asked == 1 or not self.won:
            raise NotFoundError()
        return object()

    async def add_stream(self, cfg: api.StreamConfig) -> None:
        raise BadRequestError(code=400, err_code=10065, description=OVERLAP)


def _bus(js: Any) -> JetStreamBus:
    bus = object.__new__(JetStreamBus)
    bus.js = js
    return bus


async def test_a_create_that_loses_the_race_keeps_the_stream_another_service_created() -> None:
    js = _RacedJetStream(won=True)
    await _bus(js)._ensure_stream("ns_CMD", api.StreamConfig(name="ns_CMD", subjects=["ns.cmd.>"]))
    assert js.asked == 2  # it looked again, and found the stream


async def test_a_create_refused_for_a_stream_that_is_not_there_fails_with_the_reason() -> None:
    with pytest.raises(BusError, match=OVERLAP):
        await _bus(_RacedJetStream(won=False))._ensure_stream(
            "ns_CMD", api.StreamConfig(name="ns_CMD", subjects=["ns.cmd.>"]))
