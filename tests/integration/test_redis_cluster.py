"""The store on a Redis Cluster (three primaries, a replica each): a batch whose transitions belong to shards on
several primaries runs each on its node, in one round trip per node; ``WAIT`` holds on every node it touched;
and when a primary dies, the store follows the failover to its replica with nothing acknowledged lost."""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.crc import key_slot

from shared.localcluster import RedisCluster, start_redis_cluster
from shared.state import RedisState
from shared.state.client import redis_client
from shared.state.outage import is_outage

pytestmark = [pytest.mark.integration, pytest.mark.ha, pytest.mark.timeout(90)]
SHARDS = 6


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    r = start_redis_cluster(Path(tmp_path_factory.mktemp("cluster-faults")))
    yield r
    r.stop()


def job_in(shard: int, tag: str) -> str:
    return next(j for k in range(10_000) if zlib.crc32((j := f"{tag}-{k}").encode()) % SHARDS == shard)


def store(rig: RedisCluster, namespace: str, wait: int = 0) -> RedisState:
    return RedisState(redis_client(rig.url, decode_responses=False), namespace, SHARDS, wait_replicas=wait)


async def primaries_of(s: RedisState) -> set[str]:
    await s.redis.initialize()  # type: ignore[union-attr]
    nodes = s.redis.nodes_manager  # type: ignore[union-attr]
    return {nodes.get_node_from_slot(key_slot(s.keys(k).tag.encode())).name for k in range(SHARDS)}


async def test_a_batch_across_shards_runs_every_transition_on_the_primary_of_its_shard(rig: RedisCluster) -> None:
    s = store(rig, "spread", wait=1)  # and each node's replica holds what was written there
    try:
        await s.load_scripts()
        assert len(await primaries_of(s)) >= 2  # the shards' slots are spread over the primaries
        jobs = [job_in(k, "j") for k in range(SHARDS)]
        b = s.batch()
        for j in jobs:
            b.enqueue(j, b"{}", 0, 1.0, "queued", 1.0)
        assert await b.run() == ["queued"] * SHARDS
        for k, j in enumerate(jobs):
            assert await s.pending_ids(k) == [j]
        assert await s.pending_count() == SHARDS
    finally:
        await s.wipe()
        await s.close()


async def test_losing_a_primary_fails_over_and_the_store_follows_with_nothing_acknowledged_lost(
    rig: RedisCluster,
) -> None:
    s = store(rig, "fail", wait=1)
    try:
        await s.load_scripts()
        before = [job_in(k, "a") for k in range(SHARDS)]
        b = s.batch()
        for j in before:
            b.enqueue(j, b"{}", 0, 1.0, "queued", 1.0)
        assert await b.run() == ["queued"] * SHARDS  # acknowledged: a replica of each primary holds it
        nodes = s.redis.nodes_manager  # type: ignore[union-attr]
        victim_name = nodes.get_node_from_slot(key_slot(s.keys(0).tag.encode())).name
        victim = next(n for n in rig.nodes if n.url.split("//", 1)[1].split("/", 1)[0] == victim_name)
        assert victim.proc is not None
        victim.proc.kill()
        victim.proc.wait(10)
        t0 = time.monotonic()
        while sum(r == "master" for r in rig.roles().values()) < 3:  # its replica takes its slots over
            assert time.monotonic() - t0 < 30, "the cluster did not fail over"
            await asyncio.sleep(0.2)
        promoted = time.monotonic() - t0
        # back as a replica of the promoted node: until then the new primary has no replica, and WAIT 1 holds
        # every write there back (an outage), as it should
        await asyncio.to_thread(victim.restart)
        outages = 0
        while True:  # as a consumer does: an outage is waited out, then the same transitions run again
            try:
                b = s.batch()
                for k in range(SHARDS):
                    b.enqueue(job_in(k, "b"), b"{}", 0, 2.0, "queued", 2.0)
                await b.run()
                break
            except Exception as exc:
                assert is_outage(exc), repr(exc)
                outages += 1
                assert time.monotonic() - t0 < 30, "the cluster did not fail over"
                await asyncio.sleep(0.5)
        print(f"\nprimary {victim_name} killed: replica promoted after {promoted:.1f} s, writes acknowledged "
              f"again after {time.monotonic() - t0:.1f} s ({outages} outage(s) waited out)")
        for k in range(SHARDS):
            assert await s.pending_ids(k) == sorted([before[k], job_in(k, "b")], key=lambda j: j.startswith("b"))
    finally:
        await s.wipe()
        await s.close()
