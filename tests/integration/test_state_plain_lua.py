"""Whole-GPU gangs and time-sliced shares through the Lua transitions on a real Redis: all-or-nothing gang
reservations, a compare-and-set conflict on one GPU aborting the gang, releases freeing every slot, a lost node
re-queueing a gang once, replicas never oversubscribed (``tests/plain_state_cases.py``; the same scenarios run
on the in-memory store in ``tests/unit/test_state_plain_memory.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from plain_state_cases import CASES

from shared.state import RedisState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
async def test_the_lua_transitions(case: Any, redis_state: RedisState) -> None:
    await case(redis_state)
