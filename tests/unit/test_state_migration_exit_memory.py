"""A job ending during its move, in the in-memory store (``tests/migration_exit_cases.py``; the same cases run
on Redis in ``tests/integration/test_state_migration_exit_lua.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from migration_exit_cases import CASES

from shared.state.memory_store import MemoryState

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
async def test_the_memory_store_agrees_with_the_lua_transitions(case: Any) -> None:
    await case(MemoryState())
