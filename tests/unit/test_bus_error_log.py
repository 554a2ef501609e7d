"""What a NATS connection's errors cost the log: one line per kind of error while it repeats (nats-py's own
callback logged a traceback at each retry, twice a second while a server was down), and the last one kept for
a client that gives up to quote."""

from __future__ import annotations

import logging

import pytest

from shared.bus.health import BusHealth

pytestmark = pytest.mark.unit


async def test_a_repeated_connection_error_is_logged_once_and_another_kind_still_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    health = BusHealth()
    caplog.set_level(logging.WARNING, logger="migsched.bus")
    for _ in range(5):
        await health.on_error(ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 4222)"))
    await health.on_error(PermissionError("nats: permissions violation for publish to x"))
    assert [r.getMessage() for r in caplog.records] == [
        "NATS: ConnectionRefusedError: [Errno 111] Connect call failed ('127.0.0.1', 4222)",
        "NATS: PermissionError: nats: permissions violation for publish to x",
    ]
    assert all(r.exc_info is None for r in caplog.records)
    assert health.last_error == "PermissionError: nats: permissions violation for publish to x"
