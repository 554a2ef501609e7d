"""The stack as processes on a Redis primary and replica watched by three sentinels
(``MIGSCHED_REDIS_URL=redis+sentinel://...``): losing the primary under load fails over to the replica, every
service follows it, and every job is still accounted for exactly once.

The primary is killed with SIGKILL a third of the way into a steady load; the sentinels promote the replica
within about a second and a half, and the old primary comes back later as the new one's replica. The services
wait for one replica to hold each round trip of transitions before acting on it (``MIGSCHED_REDIS_WAIT_REPLICAS``),
so nothing a command or an exit was sent for is lost with the primary; the audit after the load checks it: one
terminal state per job, one completed exit per finished job, no slice double-booked. How long decisions paused is
printed (`-s`), never asserted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from fault_harness import Load, assert_accounted, stack_on_redis, through_fault

from migsched.stack import Stack
from shared.localcluster import RedisSentinel, start_redis_sentinel

pytestmark = [pytest.mark.e2e, pytest.mark.ha, pytest.mark.timeout(150)]



@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinel]:
    rig = start_redis_sentinel(tmp_path_factory.mktemp("sentinel"))
    yield rig
    rig.stop()


@pytest.fixture(scope="module")
def stack(sentinel: RedisSentinel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # as in production: a transition is acted on only once a replica holds it, so the failover loses none
    with stack_on_redis(sentinel.url, tmp_path_factory, "sentinel", env={"MIGSCHED_REDIS_WAIT_REPLICAS": "1"}) as st:
        yield st


async def test_losing_the_redis_primary_fails_over_and_loses_no_job(sentinel: RedisSentinel, stack: Stack) -> None:
    before = sentinel.primary()
    victim = sentinel.redis[before]

    async def fault(load: Load) -> None:
        assert victim.proc is not None
        victim.proc.kill()
        await asyncio.to_thread(victim.proc.wait, 10)
        await load.until_published(0.7, timeout=60)
        await asyncio.to_thread(victim.restart)  # back as the new primary's replica (the sentinels see to it)

    out, ids, pause = await through_fault(stack, "sen", fault)
    after = sentinel.primary()
    assert after != before, "the sentinels did not fail the primary over"
    assert_accounted(out, ids)
    print(f"\nRedis primary {before} killed, {after} promoted; longest pause between placements {pause:.2f} s")
