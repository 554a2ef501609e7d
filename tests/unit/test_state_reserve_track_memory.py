"""A reservation tracking its own place command, in the in-memory store: the scenarios of
``tests/reserve_track_cases.py``, which ``tests/integration/test_state_reserve_track_lua.py`` runs on Redis."""

from __future__ import annotations

from typing import Any

import pytest
from reserve_track_cases import CASES

from shared.state.memory_store import MemoryState

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
async def test_the_memory_store_agrees_with_the_lua_transitions(case: Any) -> None:
    await case(MemoryState())
