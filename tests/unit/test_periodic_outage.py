"""A service's periodic jobs outlive a server's outage: a Redis failover or a NATS restart costs one warning line
per skipped run, not a traceback; any other fault keeps its traceback (it is a bug to look at)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from services.common.service import Service
from services.common.testing import make_settings
from shared.bus import MemoryBus
from shared.state.memory_store import MemoryState

pytestmark = pytest.mark.unit


async def test_a_periodic_job_that_meets_an_outage_logs_one_line_and_runs_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = make_settings("t", "nats://unused", "redis://unused")
    svc = Service(settings, MemoryBus(settings), MemoryState())
    faults: list[Exception] = [RedisConnectionError("Connection closed by server."), ValueError("a bug")]
    ran = asyncio.Event()

    async def job() -> None:
        if faults:
            raise faults.pop(0)
        ran.set()

    caplog.set_level(logging.WARNING, logger="migsched.service")
    task = asyncio.create_task(svc._every("backfill", 0.01, job))
    await asyncio.wait_for(ran.wait(), 5)
    svc._stopping.set()
    await task
    skipped, failed = caplog.records[0], caplog.records[1]
    assert skipped.levelno == logging.WARNING and skipped.exc_info is None
    assert skipped.getMessage() == ("periodic backfill skipped: a server is not answering (ConnectionError: "
                                    "Connection closed by server.)")
    assert failed.levelno == logging.ERROR and failed.exc_info is not None  # a bug keeps its traceback
