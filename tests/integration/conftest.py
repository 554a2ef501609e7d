"""Fixtures of the integration tests: a ``RedisState`` on the real Redis, in the test's own namespace."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.common.testing import make_settings
from shared.state import RedisState


@pytest.fixture
async def redis_state(prefix: str, nats_url: str, redis_url: str) -> AsyncIterator[RedisState]:
    """The store the services use, on keys of this test only; wiped and closed after the test."""
    state = RedisState.from_settings(make_settings(prefix, nats_url, redis_url))
    try:
        yield state
    finally:
        await state.wipe()
        await state.close()
