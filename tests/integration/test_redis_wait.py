"""With ``MIGSCHED_REDIS_WAIT_REPLICAS``, a round trip of transitions counts only once that many replicas hold
it: fewer in time is an outage the services wait out (and retry), never a result they act on. On a primary with
two replicas, started from the binaries."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.localcluster import RedisSentinel, start_redis_sentinel
from shared.state import RedisState
from shared.state.batch import NotReplicated
from shared.state.client import redis_client
from shared.state.outage import is_outage

pytestmark = [pytest.mark.integration, pytest.mark.ha, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinel]:
    r = start_redis_sentinel(Path(tmp_path_factory.mktemp("wait")))
    yield r
    r.stop()


def state(rig: RedisSentinel, replicas: int, timeout_s: float = 0.3) -> RedisState:
    return RedisState(redis_client(rig.url, decode_responses=False), "w", 1, wait_replicas=replicas,
                      wait_timeout_s=timeout_s)


async def test_a_transition_both_replicas_hold_returns_its_result(rig: RedisSentinel) -> None:
    s = state(rig, 2)
    try:
        await s.load_scripts()
        assert await s.enqueue("j1", b"{}", 0, 1.0, "queued", 1.0) == "queued"
    finally:
        await s.close()


async def test_too_few_replicas_in_time_is_an_outage_and_the_transition_is_retried_harmlessly(
    rig: RedisSentinel,
) -> None:
    victim = next(r for i, r in enumerate(rig.redis) if i != rig.primary())
    assert victim.proc is not None
    victim.proc.kill()
    victim.proc.wait(10)
    s = state(rig, 2)
    try:
        await s.load_scripts()
        with pytest.raises(NotReplicated) as caught:
            await s.enqueue("j2", b"{}", 0, 1.0, "queued", 1.0)
        assert is_outage(caught.value) and "1 of the 2 replica(s)" in str(caught.value)
        one = state(rig, 1)
        try:  # the retry, once enough replicas answer: the transition ran once, the second run is a no-op
            assert await one.enqueue("j2", b"{}", 0, 1.0, "queued", 1.0) != "queued"
            assert await one.pending_ids(0) == ["j1", "j2"]
        finally:
            await one.close()
    finally:
        await s.close()
        victim.restart()
