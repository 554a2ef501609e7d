"""The two stores every contract case runs on: the in-memory twin and the real Redis (its Lua transitions)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.common.testing import private_state
from shared.state.memory_store import MemoryState

STORES = [pytest.param("memory", marks=pytest.mark.unit), pytest.param("redis", marks=pytest.mark.integration)]


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest, prefix: str) -> AsyncIterator[Any]:
    """``MemoryState``, or ``RedisState`` on this test's own keys of the real Redis (wiped after the test)."""
    if request.param == "memory":
        yield MemoryState()
        return
    async with private_state(prefix, request.getfixturevalue("nats_url"), request.getfixturevalue("redis_url")) as s:
        yield s
