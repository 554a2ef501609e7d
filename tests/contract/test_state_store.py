"""The state store's contract: every scenario runs on the in-memory store and on real Redis, which must agree.

The scenarios (``tests/contract/state_cases/``) drive the store through its public transitions and read it
back, each checking its own invariants and ending with ``audit()``: gangs and time-sliced shares, expiry of
ended jobs, foreign jobs found at registration, late runs of timed-out commands, exits of an earlier
placement's run, moves that end without taking, nodes lost or re-registered during a move, the command
tracking a reservation carries, tenants' usage counters with the quota check of a reservation, and a job settled
before it was ever recorded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.contract.state_cases import (
    earlier_exit,
    expiry,
    foreign_job,
    gang_across,
    late_run,
    lost_move,
    migration_exit,
    plain_state,
    quota_usage,
    reserve_track,
    settled_on_arrival,
)

pytestmark = pytest.mark.timeout(30)

Case = Callable[[Any], Awaitable[None]]
SUITES = {"plain": plain_state, "expiry": expiry, "foreign": foreign_job, "late-run": late_run,
          "move-exit": migration_exit, "reserve-track": reserve_track, "gang-across": gang_across,
          "earlier-exit": earlier_exit, "lost-move": lost_move, "quota": quota_usage,
          "settled-on-arrival": settled_on_arrival}
CASES: list[tuple[str, Case]] = [(f"{name}:{case.__name__}", case) for name, mod in SUITES.items()
                                 for case in mod.CASES]


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=[i for i, _ in CASES])
async def test_both_stores_agree_on_every_scenario(case: Case, store: Any) -> None:
    await case(store)


def test_both_stores_implement_the_port_the_services_depend_on() -> None:
    from shared.ports import StateStore, TransitionBatch
    from shared.state import RedisState
    from shared.state.memory_store import MemoryState

    implementations: list[type[StateStore]] = [MemoryState, RedisState]  # checked structurally by mypy too
    memory = MemoryState()
    assert isinstance(memory, StateStore) and isinstance(memory.batch(), TransitionBatch)
    for impl in implementations:
        missing = [m for m in ("reserve", "release", "mark_running", "batch", "snapshot") if not hasattr(impl, m)]
        assert missing == [], (impl, missing)
