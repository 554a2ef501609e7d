"""A job ending during its move, through ``lua/release.lua`` and ``lua/migrate.lua`` on a real Redis
(``tests/migration_exit_cases.py``; the same cases run on the in-memory store in
``tests/unit/test_state_migration_exit_memory.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from migration_exit_cases import CASES

from shared.state import RedisState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
async def test_the_lua_transitions(case: Any, redis_state: RedisState) -> None:
    await case(redis_state)
