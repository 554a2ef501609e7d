"""A registration finding a job the state does not hold, through ``lua/node.lua`` on a real Redis
(``tests/foreign_job_cases.py``; the same scenarios run on the in-memory store in
``tests/unit/test_state_foreign_memory.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from foreign_job_cases import CASES

from shared.state import RedisState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
async def test_the_lua_transitions(case: Any, redis_state: RedisState) -> None:
    await case(redis_state)
