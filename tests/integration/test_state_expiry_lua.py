"""The audit's rule on ended jobs, on a real Redis (the expiry scenarios of ``lua/expire.lua`` run on both
stores in ``tests/contract/``)."""

from __future__ import annotations

import pytest

from services.common.testing import make_settings
from shared.state import RedisState, audit
from tests.contract.state_cases.expiry import GEO, NOW

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


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
