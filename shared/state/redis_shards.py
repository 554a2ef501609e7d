"""Where the Redis store's keys live: the connection, the Lua scripts, and which shard holds a job or a node (as
this process has learnt it). ``RedisReads`` and ``RedisState`` build on it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from shared.state.batch import Batch
from shared.state.cluster_roundtrip import ClusterRoundTrips
from shared.state.codec import SCRIPTS, block_script_source, script_source
from shared.state.deployment import claim_shards
from shared.state.job_routes import JobRoutes
from shared.state.keys import Keys
from shared.state.roundtrip import RoundTrips
from shared.state.sharding import shard_of


class RedisShards:
    """The store for one namespace. ``shards`` must be the same in every process of a deployment."""

    def __init__(self, redis: aioredis.Redis, namespace: str = "", shards: int = 1, wait_replicas: int = 0,
                 wait_timeout_s: float = 1.0) -> None:
        self.redis = redis
        self.wait_replicas = wait_replicas
        """Replicas every round trip of transitions must reach before its results are used (``Batch``)."""
        self.wait_timeout_ms = max(1, round(wait_timeout_s * 1000))
        self.namespace = namespace
        self.shards = shards
        self._keys = [Keys(namespace, s) for s in range(shards)]
        self._node_shard: dict[str, int] = {}
        """Node -> shard, as learnt (``locate``, ``nodes``, registrations): a node keeps its first shard."""
        self.routes = JobRoutes(redis, self._keys)
        """Where jobs live: routes read and written, and what this process has learnt of them."""
        self._scripts: dict[str, Any] = {}
        self.blocks_key = f"{{{namespace or 'migsched'}:blocks}}"
        """Block label -> its shard (``block_shard``): a key of its own slot, read only at registrations."""
        self.block_script = redis.register_script(block_script_source())
        self.roundtrips: RoundTrips | ClusterRoundTrips = (
            ClusterRoundTrips(redis) if isinstance(redis, RedisCluster) else RoundTrips(redis))

    async def close(self) -> None:
        await self.roundtrips.close()
        await self.redis.aclose()

    async def claim_shards(self) -> None:
        """Record this process's shard count as the namespace's, or refuse one that differs
        (``shared.state.deployment``)."""
        await claim_shards(self.redis, self.namespace, self.shards)

    def sha(self, name: str) -> str:
        return str(self.script(name).sha)

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every transition (at start-up, and again after Redis forgot them)."""
        for name in SCRIPTS:
            await self.redis.script_load(script_source(name))
        await self.redis.script_load(block_script_source())

    def script(self, name: str) -> Any:
        s = self._scripts.get(name)
        if s is None:
            s = self._scripts[name] = self.redis.register_script(script_source(name))
        return s

    def keys(self, shard: int) -> Keys:
        return self._keys[shard]

    def job_keys(self, job_id: str) -> Keys:
        return self._keys[self.job_shard(job_id)]

    def job_shard(self, job_id: str) -> int:
        """The job's shard as this process knows it (``locate_jobs``, ``route``): the one it was routed to,
        else its home (crc32 of its id)."""
        return self.routes.learnt.shard(job_id)

    def learn_job(self, job_id: str, shard: int) -> None:
        self.routes.learnt.learn(job_id, shard)

    async def locate_jobs(self, job_ids: Iterable[str]) -> None:
        """Learn where each job not known here lives, before a read (transitions find out by themselves)."""
        await self.routes.locate(job_ids)

    async def route(self, wanted: Mapping[str, int], now: float) -> dict[str, int]:
        return await self.routes.route(self.batch(), wanted, now)

    async def prune_routes(self, before: float) -> int:
        return await self.routes.prune(before)

    def node_keys(self, node: str) -> Keys:
        return self._keys[self.node_shard(node)]

    def node_shard(self, node: str) -> int:
        """The node's shard as this process knows it (``locate``): its block's when it registered with one,
        else its name's."""
        got = self._node_shard.get(node)
        return shard_of(node, self.shards) if got is None else got

    async def locate(self, nodes: Iterable[str]) -> None:
        """Learn the shard of every node not known here yet (one read of each shard's node set): a node whose
        ``block`` label chose its shard cannot be told by its name. Unregistered nodes stay unknown."""
        missing = sorted({n for n in nodes if n not in self._node_shard})
        if self.shards <= 1 or not missing:
            return
        pipe = self.redis.pipeline(transaction=False)
        for s in range(self.shards):
            pipe.smismember(self.keys(s).nodes, missing)
        for s, hits in enumerate(await pipe.execute()):
            for n, hit in zip(missing, hits, strict=True):
                if hit:
                    self._node_shard.setdefault(n, s)

    def batch(self) -> Batch:
        return Batch(self)

    async def _one(self, add: Any, *args: Any) -> Any:
        b = self.batch()
        getattr(b, add)(*args)
        return (await b.run())[0]
