"""A place command applied after the state gave up on it, through ``lua/mark_running.lua`` and
``lua/fail_placement.lua`` on a real Redis (``tests/late_run_cases.py``; the same scenarios run on the in-memory
store in ``tests/unit/test_state_late_run_memory.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from late_run_cases import CASES

from shared.state import RedisState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
async def test_the_lua_transitions(case: Any, redis_state: RedisState) -> None:
    await case(redis_state)
