"""The stack as processes on a Redis Cluster (three primaries, a replica each; ``MIGSCHED_REDIS_URL=
redis+cluster://...``, four shards over six nodes): losing the primary of a shard under load fails over to its
replica, every service follows, and every job is still accounted for exactly once.

The primary is killed with SIGKILL a third of the way into a steady load, and started again once its replica has
taken its slots over (it comes back as that node's replica). The services wait for a replica to hold every round
trip of transitions (``MIGSCHED_REDIS_WAIT_REPLICAS=1``), so until the old primary is back the shard's writes are
an outage the consumers wait out. How long decisions paused is printed (`-s`), never asserted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from fault_harness import Load, assert_accounted, settings_of, stack_on_redis, through_fault
from redis.crc import key_slot

from migsched.stack import Stack
from shared.localcluster import RedisCluster, start_redis_cluster
from shared.state import RedisState

pytestmark = [pytest.mark.e2e, pytest.mark.ha, pytest.mark.timeout(180)]

SHARDS = 4
NODES = 6
"""gpu-node-0..5 fall in all four shards (a shard without nodes could never place the jobs that hash to it)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    rig = start_redis_cluster(tmp_path_factory.mktemp("cluster"))
    yield rig
    rig.stop()


@pytest.fixture(scope="module")
def stack(cluster: RedisCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {"MIGSCHED_REDIS_WAIT_REPLICAS": "1", "MIGSCHED_SHARDS": str(SHARDS)}
    with stack_on_redis(cluster.url, tmp_path_factory, "cluster", env=env, nodes=NODES, gpus="A100-40GB:3",
                        nodes_per_executor=3) as st:
        yield st


async def primary_of_shard(stack: Stack, shard: int) -> str:
    state = RedisState.from_settings(settings_of(stack))
    try:
        await state.redis.initialize()  # type: ignore[union-attr]
        node = state.redis.nodes_manager.get_node_from_slot(  # type: ignore[union-attr]
            key_slot(state.keys(shard).tag.encode()))
        return str(node.name)
    finally:
        await state.close()


async def test_losing_a_redis_cluster_primary_fails_over_and_loses_no_job(cluster: RedisCluster, stack: Stack) -> None:
    name = await primary_of_shard(stack, 0)
    victim = next(n for n in cluster.nodes if n.url.split("//", 1)[1].split("/", 1)[0] == name)

    async def fault(_: Load) -> None:
        assert victim.proc is not None
        victim.proc.kill()
        await asyncio.to_thread(victim.proc.wait, 10)
        t0 = time.monotonic()
        while sum(r == "master" for r in cluster.roles().values()) < 3:
            assert time.monotonic() - t0 < 30, "the cluster did not fail over"
            await asyncio.sleep(0.2)
        await asyncio.to_thread(victim.restart)  # back as the promoted node's replica

    out, ids, pause = await through_fault(stack, "clu", fault)
    assert await primary_of_shard(stack, 0) != name, "shard 0 did not move to the promoted replica"
    # Every job finishes once, none runs twice, no slice is double-booked. Placements whose results the failover
    # held back time out and their commands run late; the stop of such a late run names the command that started
    # it, so a newer placement of the job on an instance of the same id runs on.
    assert_accounted(out, ids)
    print(f"\nRedis Cluster primary {name} killed; longest pause between placements {pause:.2f} s")
