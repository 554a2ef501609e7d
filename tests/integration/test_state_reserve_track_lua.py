"""A reservation tracking its own place command, through ``lua/reserve.lua`` on a real Redis: the scenarios of
``tests/reserve_track_cases.py``, which ``tests/unit/test_state_reserve_track_memory.py`` runs in memory."""

from __future__ import annotations

from typing import Any

import pytest
from reserve_track_cases import CASES

from shared.state import RedisState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
async def test_the_lua_transitions(case: Any, redis_state: RedisState) -> None:
    await case(redis_state)
