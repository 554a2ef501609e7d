"""A place command applied after the state gave up on it, in the in-memory store: the scenarios of
``tests/late_run_cases.py``, which ``tests/integration/test_state_late_run_lua.py`` runs on Redis."""

from __future__ import annotations

from typing import Any

import pytest
from late_run_cases import CASES

from shared.state.memory_store import MemoryState

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
async def test_the_memory_store_agrees_with_the_lua_transitions(case: Any) -> None:
    await case(MemoryState())


def test_the_registry_reads_the_attempt_back_from_the_place_command_id_either_service_sends() -> None:
    from services.common.place_command import place_cmd_id
    from services.partitioner.reports import place_attempt

    assert place_attempt(place_cmd_id("j:1", 3), "j:1") == 3
    assert place_attempt(place_cmd_id("j1", 0), "j2") is None  # another job's command
    assert place_attempt("stop:j1", "j1") is None
    assert place_attempt("mig:j1:7:start", "j1") is None
