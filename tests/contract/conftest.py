"""Each port's two implementations, which every contract case runs on: the in-memory twins, and the real Redis (its
Lua transitions) and NATS (JetStream)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.common.testing import make_settings, private_state
from shared.bus import JetStreamBus, MemoryBus
from shared.state.memory_store import MemoryState

STORES = [pytest.param("memory", marks=pytest.mark.unit), pytest.param("redis", marks=pytest.mark.integration),
          pytest.param("redis-cluster", marks=[pytest.mark.integration, pytest.mark.ha])]


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest, prefix: str) -> AsyncIterator[Any]:
    """``MemoryState``, or ``RedisState`` on this test's own keys of the real Redis, or of a Redis Cluster (wiped
    after the test)."""
    if request.param == "memory":
        yield MemoryState()
        return
    # on the cluster each test's namespace hashes to its own slot, so the cases land on every primary in turn;
    # a batch across shards on several primaries is tests/integration/test_redis_cluster.py's
    url = (request.getfixturevalue("redis_cluster").url if request.param == "redis-cluster"
           else request.getfixturevalue("redis_url"))
    async with private_state(prefix, request.getfixturevalue("nats_url"), url) as s:
        yield s


BUSES = [pytest.param("memory", marks=pytest.mark.unit), pytest.param("nats", marks=pytest.mark.integration)]


@pytest.fixture(params=BUSES)
async def bus_factory(request: pytest.FixtureRequest, prefix: str) -> AsyncIterator[Any]:
    """Makes the bus of this test's namespace with the given settings: ``MemoryBus``, or ``JetStreamBus`` on the
    real NATS (its streams created, and deleted after the test)."""
    made: list[Any] = []

    async def make(**kw: Any) -> Any:
        if request.param == "memory":
            bus: Any = MemoryBus(make_settings(prefix, "nats://unused", "redis://unused", **kw))
        else:
            nats_url = request.getfixturevalue("nats_url")
            bus = await JetStreamBus.connect(make_settings(prefix, nats_url, "redis://unused", **kw))
        await bus.ensure_streams()
        made.append(bus)
        return bus

    yield make
    for bus in made:
        await bus.delete_streams()
        await bus.close()
