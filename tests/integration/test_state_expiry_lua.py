"""Ended jobs forgotten after their retention, through ``lua/expire.lua`` (and ``set_state`` in
``lua/prelude.lua``) on a real Redis: the scenarios of ``tests/expiry_cases.py``, which
``tests/unit/test_state_expiry_memory.py`` runs on the in-memory store; and the audit's rule on ended jobs."""

from __future__ import annotations

from typing import Any

import pytest
from expiry_cases import CASES, GEO, NOW

from services.common.testing import make_settings
from shared.state import RedisState, audit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
async def test_the_lua_transitions(case: Any, redis_state: RedisState) -> None:
    await case(redis_state)


async def test_the_audit_flags_an_ended_entry_whose_job_is_not_terminal(
    prefix: str, redis_url: str, nats_url: str
) -> None:
    state = RedisState.from_settings(make_settings(prefix, nats_url, redis_url))
    try:
        await state.enqueue("live", b"{}", 0, NOW, "no room", NOW)
        assert await audit(state, GEO) == []
        # only a bug (or a hand edit) can list a live job as ended: the sweep would skip it, the audit says so
        await state.redis.zadd(state.keys(0).done, {"live": NOW})
        assert [(v.kind, v.subject) for v in await audit(state, GEO)] == [("done", "live")]
        assert await state.expire(0, NOW + 1, 1000) == 0
        assert (await state.job("live")).state == "pending"  # type: ignore[union-attr]
        assert await state.ended_before(0, NOW + 1) == []  # it only left the ended list
        assert await audit(state, GEO) == []
    finally:
        await state.wipe()
        await state.close()
