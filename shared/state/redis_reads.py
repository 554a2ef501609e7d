"""The Redis store's reads: GPUs, holds, usage, occupancy, jobs and their history, the pending queue, nodes,
commands, the ended and placing jobs, and one consistent dump of a shard for the audit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from redis.asyncio.cluster import RedisCluster

from shared.state import usage
from shared.state.codec import _HIST, _s, decode_dump, decode_gpu, decode_job, history_raw
from shared.state.model import HistoryEntry, Hold, JobRecord, StoredGpu, decode_holds
from shared.state.reads import DerivedReads
from shared.state.redis_shards import RedisShards


class RedisReads(DerivedReads, RedisShards):
    """What ``RedisState`` reads."""

    async def gpu_ids(self, shard: int | None = None) -> list[str]:
        shards = range(self.shards) if shard is None else (shard,)
        pipe = self.redis.pipeline(transaction=False)
        for s in shards:
            pipe.zrange(self.keys(s).gpus, 0, -1)
        return [_s(x) for ids in await pipe.execute() for x in ids]

    async def get_gpus(self, gpu_ids: Sequence[str]) -> list[StoredGpu | None]:
        """GPUs by id, one round trip. A GPU id ``node/index`` names its shard through the node."""
        await self.locate(g.rsplit("/", 1)[0] for g in gpu_ids)
        pipe = self.redis.pipeline(transaction=False)
        for g in gpu_ids:
            pipe.hgetall(self.node_keys(g.rsplit("/", 1)[0]).gpu(g))
        return [decode_gpu(g, h) for g, h in zip(gpu_ids, await pipe.execute(), strict=True)]

    async def holds(self, shard: int = 0) -> tuple[float, list[Hold]]:
        """(when they were planned, the reservations) as last put; (0, []) when none ever was."""
        return decode_holds(await self.redis.get(self.keys(shard).holds))

    async def tenant_usage(self, shard: int = 0) -> dict[str, dict[str, float]]:
        """What the shard's active jobs are charged, per tenant and resource (``{ns:s}:usage``)."""
        return usage.decode(await self.redis.hgetall(self.keys(shard).usage))

    async def occupancy(self, shard: int = 0) -> bytes:
        """The shard's compact occupancy array: byte i = busy mask of the GPU at position i."""
        raw = await self.redis.get(self.keys(shard).occ)
        return raw if isinstance(raw, bytes) else b""

    async def job(self, job_id: str) -> JobRecord | None:
        await self.locate_jobs([job_id])
        raw: dict[bytes, bytes] = await self.redis.hgetall(self.job_keys(job_id).job(job_id))  # type: ignore[assignment]
        return decode_job(job_id, raw)

    async def jobs(self, job_ids: Sequence[str]) -> list[JobRecord | None]:
        await self.locate_jobs(job_ids)
        pipe = self.redis.pipeline(transaction=False)
        for j in job_ids:
            pipe.hgetall(self.job_keys(j).job(j))
        return [decode_job(j, h) for j, h in zip(job_ids, await pipe.execute(), strict=True)]

    async def history(self, job_id: str) -> list[HistoryEntry]:
        await self.locate_jobs([job_id])
        k = self.job_keys(job_id)
        # one instant (MULTI/EXEC): an entry is never seen twice or missed. redis-py's cluster transactions keep
        # state across event loops and fail in the next one; there the two reads go as a plain pipeline (the
        # list is only an older version's history, which nothing appends to any more)
        pipe = self.redis.pipeline(transaction=not isinstance(self.redis, RedisCluster))
        pipe.hgetall(k.job(job_id))
        pipe.lrange(k.hist(job_id), 0, -1)
        job, legacy = await pipe.execute()
        return [_HIST.decode(x) for x in history_raw(job, legacy)]

    async def pending(self, shard: int = 0, limit: int = 256) -> list[JobRecord]:
        """The first ``limit`` pending jobs in queue order (priority, then age)."""
        return [j for j in await self.jobs(await self.pending_ids(shard, limit)) if j is not None]

    async def pending_count(self, shard: int | None = None) -> int:
        shards = range(self.shards) if shard is None else (shard,)
        return sum([int(await self.redis.zcard(self.keys(s).pending)) for s in shards])

    async def pending_ids(self, shard: int = 0, limit: int = -1) -> list[str]:
        """Queued job ids in queue order (all when ``limit`` is -1)."""
        end = -1 if limit < 0 else limit - 1
        ids = [_s(x) for x in await self.redis.zrange(self.keys(shard).pending, 0, end)]
        for j in ids:  # queued here, so they live here
            self.routes.learnt.learn(j, shard)
        return ids

    async def all_job_ids(self, shard: int) -> list[str]:
        return sorted(_s(x) for x in await self.redis.smembers(self.keys(shard).jobs))

    async def nodes(self, shard: int | None = None) -> dict[str, dict[str, str]]:
        shards = range(self.shards) if shard is None else (shard,)
        out: dict[str, dict[str, str]] = {}
        for s in shards:
            names = sorted(_s(n) for n in await self.redis.smembers(self.keys(s).nodes))
            pipe = self.redis.pipeline(transaction=False)
            for n in names:
                pipe.hgetall(self.keys(s).node(n))
            for n, h in zip(names, await pipe.execute(), strict=True):
                out[n] = {_s(k): _s(v) for k, v in h.items()}
                self._node_shard.setdefault(n, s)
        return out

    async def commands(self, shard: int = 0) -> dict[str, dict[str, Any]]:
        raw = await self.redis.hgetall(self.keys(shard).cmds)
        return {_s(k): msgspec.json.decode(v) for k, v in raw.items()}

    async def ended_before(self, shard: int, before: float) -> list[str]:
        """Jobs that reached a terminal state before ``before`` and are still kept, the oldest first."""
        return [_s(x) for x in await self.redis.zrangebyscore(self.keys(shard).done, "-inf", f"({before!r}")]

    async def placing_since(self, shard: int, before: float) -> list[str]:
        """Jobs that entered placing before ``before`` and are still there."""
        return [_s(x) for x in await self.redis.zrangebyscore(self.keys(shard).placing, "-inf", before)]

    async def dump(
        self, shard: int
    ) -> tuple[list[StoredGpu], list[JobRecord], set[str], bytes, set[str], dict[str, dict[str, float]]]:
        """One consistent read of a shard (one Lua script): GPUs, jobs (state, placement and charge only), the
        queue, the occupancy array, the ended jobs (``:done``), the tenants' usage counters. For the audit of a
        live system, where separate reads would race the services."""
        return decode_dump(await self.script("dump")([self.keys(shard).gpus], []))
