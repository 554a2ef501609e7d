"""``MemoryState``'s reads, as ``RedisState``'s: GPUs, jobs, history, the pending queue, nodes, commands.
Every read hands out copies, as a read from Redis would."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import msgspec

from shared.state import usage
from shared.state.memory_prelude import MemoryPrelude
from shared.state.model import HistoryEntry, Hold, JobRecord, StoredGpu, decode_holds, encode_holds
from shared.state.reads import DerivedReads


class MemoryReads(DerivedReads, MemoryPrelude):
    """The reads of ``MemoryState``."""

    async def gpu_ids(self, shard: int | None = None) -> list[str]:
        shards = range(self.shards) if shard is None else (shard,)
        return [g for s in shards for g in sorted(self._s[s].gpus, key=lambda k: self._s[s].gpus[k].pos)]

    async def get_gpus(self, gpu_ids: Sequence[str]) -> list[StoredGpu | None]:
        return [copy.deepcopy(self._gpu(g)[1]) for g in gpu_ids]

    async def put_holds(self, shard: int, holds: Sequence[Hold], now: float) -> None:
        self._s[shard].holds = encode_holds(holds, now)

    async def holds(self, shard: int = 0) -> tuple[float, list[Hold]]:
        return decode_holds(self._s[shard].holds)

    async def tenant_usage(self, shard: int = 0) -> dict[str, dict[str, float]]:
        return usage.decode(self._s[shard].usage)

    async def occupancy(self, shard: int = 0) -> bytes:
        return bytes(self._s[shard].occ)

    async def job(self, job_id: str) -> JobRecord | None:
        return copy.deepcopy(self._js(job_id).jobs.get(job_id))

    async def jobs(self, job_ids: Sequence[str]) -> list[JobRecord | None]:
        return [await self.job(j) for j in job_ids]

    async def history(self, job_id: str) -> list[HistoryEntry]:
        return list(self._js(job_id).hist.get(job_id, []))

    async def pending_ids(self, shard: int = 0, limit: int = -1) -> list[str]:
        p = self._s[shard].pending
        ids = sorted(p, key=lambda k: (p[k], k))
        return ids if limit < 0 else ids[:limit]

    async def pending(self, shard: int = 0, limit: int = 256) -> list[JobRecord]:
        return [j for j in await self.jobs((await self.pending_ids(shard))[:limit]) if j is not None]

    async def pending_count(self, shard: int | None = None) -> int:
        shards = range(self.shards) if shard is None else (shard,)
        return sum(len(self._s[s].pending) for s in shards)

    async def all_job_ids(self, shard: int) -> list[str]:
        return sorted(self._s[shard].jobs)

    async def nodes(self, shard: int | None = None) -> dict[str, dict[str, str]]:
        shards = range(self.shards) if shard is None else (shard,)
        return {n: dict(h) for s in shards for n, h in sorted(self._s[s].nodes.items())}

    async def dump(
        self, shard: int
    ) -> tuple[list[StoredGpu], list[JobRecord], set[str], bytes, set[str], dict[str, dict[str, float]]]:
        return (
            await self.load_gpus(shard),
            [j for j in await self.jobs(await self.all_job_ids(shard)) if j],
            set(self._s[shard].pending),
            bytes(self._s[shard].occ),
            set(self._s[shard].done),
            await self.tenant_usage(shard),
        )

    async def commands(self, shard: int = 0) -> dict[str, dict[str, Any]]:
        return {k: msgspec.json.decode(msgspec.json.encode(v)) for k, v in self._s[shard].cmds.items()}

    async def ended_before(self, shard: int, before: float) -> list[str]:
        d = self._s[shard].done
        return [j for t, j in sorted((t, j) for j, t in d.items() if t < before)]

    async def placing_since(self, shard: int, before: float) -> list[str]:
        return sorted(j for j, t in self._s[shard].placing.items() if t <= before)

    async def forget_command(self, shard: int, cmd_id: str) -> None:
        self._s[shard].cmds.pop(cmd_id, None)
