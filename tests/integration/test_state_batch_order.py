"""A batch that mixes Lua transitions with command tracking returns one result per call, in call order (the
tracking HSET used to go into the pipeline at once and the scripts only at ``run()``, so the results of a
mixed batch were shifted)."""

from __future__ import annotations

import pytest

from services.common.testing import make_settings
from shared.state import RedisState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def test_a_mixed_batch_returns_its_results_in_call_order(prefix: str, redis_url: str, nats_url: str) -> None:
    state = RedisState.from_settings(make_settings(prefix, nats_url, redis_url))
    try:
        b = state.batch()
        first = b.release("ghost", "completed", "exit completed", 1000.0, "n1/0:1g.5gb@0")
        tracked = b.track_command(0, "place:j1:0", {"node": "n1", "kind": "place", "job": "j1", "at": 1000.0})
        second = b.release("ghost2", "completed", "exit completed", 1000.0, "")
        res = await b.run()
        assert (res[first].status, res[second].status) == ("noop", "noop")
        assert res[tracked] == 1
        assert set(await state.commands(0)) == {"place:j1:0"}
    finally:
        await state.wipe()
        await state.close()
