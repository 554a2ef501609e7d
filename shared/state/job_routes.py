"""Where jobs live: a job lives in its home shard (crc32 of its id) unless it was routed to another
(``lua/route.lua``), and a route never changes while the job exists. ``JobShards`` is what one process has
learnt (bounded in size and in age: a job forgotten, or learnt too long ago, is read again); ``JobRoutes`` reads
and writes the routes in Redis; ``route_parts``, ``route_shard`` and ``lives_in`` read a route and
``lua/route.lua``'s answer, for both stores."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from shared.state.codec import _s
from shared.state.keys import Keys
from shared.state.sharding import shard_of


def route_parts(raw: str) -> tuple[int, float]:
    """A route (``:routes`` entry ``"<shard>:<routed at>"``, ``lua/route.lua``) -> (shard, routed at); shard -1
    when unreadable."""
    head, _, at = raw.partition(":")
    try:
        return (int(head) if head.isdigit() else -1), float(at or 0)
    except ValueError:
        return -1, 0.0


def route_shard(raw: str, shards: int, home: int) -> int:
    """The shard a route names; ``home`` when it names none that exists (fewer shards now)."""
    return lives_in(route_parts(raw)[0], shards, home)


def lives_in(answer: int, shards: int, home: int) -> int:
    """The shard a job lives in, from ``lua/route.lua``'s answer (-1: at home) or a route's shard: ``home`` for
    any that names no shard of this deployment."""
    return answer if 0 <= answer < shards else home


LEARNT_MAX = 200_000
"""Jobs remembered per process (about 100 bytes each); past that the oldest learnt are dropped."""
LEARNT_FOR_S = 60.0
"""How long what was learnt of a job is used before it is read again. A route never changes while its job
exists, but a job's id may come back once its record has expired (the registry forgets its route then), and the
new job may live elsewhere: re-reading bounds how long a process could look for it in the old place."""


class JobShards:
    def __init__(self, shards: int, limit: int = LEARNT_MAX, for_s: float = LEARNT_FOR_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.shards = shards
        self.limit = limit
        self.for_s = for_s
        self.clock = clock
        self._at: dict[str, tuple[int, float]] = {}

    def shard(self, job_id: str) -> int:
        """Where the job lives, as learnt; its home when never learnt, or learnt too long ago (a transition sent
        home learns a route again: ``Batch``)."""
        got = self._at.get(job_id)
        if got is None or got[1] < self.clock() - self.for_s:
            return shard_of(job_id, self.shards)
        return got[0]

    def unknown(self, job_ids: Iterable[str]) -> list[str]:
        """The ids not learnt, or learnt too long ago, each once, in order; none with one shard (every job
        lives in it)."""
        if self.shards <= 1:
            return []
        since = self.clock() - self.for_s
        at = self._at
        return [j for j in dict.fromkeys(job_ids) if (got := at.get(j)) is None or got[1] < since]

    def learn(self, job_id: str, shard: int) -> None:
        if self.shards <= 1:
            return
        self._at.pop(job_id, None)
        self._at[job_id] = (shard, self.clock())
        if len(self._at) > self.limit:  # a tenth at once, so that the scan is paid once per many learnt
            drop = len(self._at) - self.limit * 9 // 10
            for old in list(self._at)[:drop]:
                del self._at[old]

    def forget(self, job_ids: Iterable[str]) -> None:
        for j in job_ids:
            self._at.pop(j, None)


class JobRoutes:
    """Where jobs live in a deployment of several shards, read from Redis: the routes (``:routes`` of each home
    shard, ``lua/route.lua``) and what this process has learnt of them (``learnt``)."""

    def __init__(self, redis: Any, keys: Sequence[Keys]) -> None:
        self.redis = redis
        self.keys = keys
        self.shards = len(keys)
        self.learnt = JobShards(self.shards)

    def home(self, job_id: str) -> Keys:
        return self.keys[shard_of(job_id, self.shards)]

    async def locate(self, job_ids: Iterable[str]) -> None:
        """Learn where each job not known here lives (one pipelined read of the home shards): its route, else its
        home once its record is there. A job found nowhere yet stays at its home until ``route`` says otherwise,
        and is not remembered."""
        todo = self.learnt.unknown(job_ids)
        for j, (routed, at_home) in zip(todo, await self._read(todo), strict=True):
            if routed is not None:
                self.learnt.learn(j, routed)
            elif at_home:
                self.learnt.learn(j, shard_of(j, self.shards))

    async def shards_of(self, job_ids: Sequence[str]) -> dict[str, int]:
        """Where each job lives, read now (one pipelined read; nothing learnt): its route, else its home."""
        return {j: shard_of(j, self.shards) if routed is None else routed
                for j, (routed, _) in zip(job_ids, await self._read(job_ids), strict=True)}

    async def _read(self, job_ids: Sequence[str]) -> list[tuple[int | None, bool]]:
        """Per job: the shard its home routes it to (None: no route), and whether its record is at home."""
        if not job_ids or self.shards <= 1:
            return [(None, True)] * len(job_ids)
        pipe = self.redis.pipeline(transaction=False)
        for j in job_ids:
            pipe.hget(self.home(j).routes, j)
            pipe.exists(self.home(j).job(j))
        got = await pipe.execute()
        return [(None if got[2 * n] is None else route_shard(_s(got[2 * n]), self.shards, shard_of(j, self.shards)),
                 bool(got[2 * n + 1])) for n, j in enumerate(job_ids)]

    async def route(self, batch: Any, wanted: Mapping[str, int], now: float) -> dict[str, int]:
        """Send each new job to the shard named (``lua/route.lua``, atomic in its home shard; ``batch``: an empty
        ``Batch``) -> where each job lives: the first route of a job wins a race or a redelivery, and a job
        already recorded at home stays there."""
        if self.shards <= 1 or not wanted:
            return {j: 0 for j in wanted}
        ids = sorted(wanted)
        for j in ids:
            batch.route(j, wanted[j], now)
        out: dict[str, int] = {}
        for j, got in zip(ids, await batch.run(), strict=True):
            out[j] = lives_in(got, self.shards, shard_of(j, self.shards))
            self.learnt.learn(j, out[j])
        return out

    async def prune(self, before: float) -> int:
        """Forget the routes, recorded before ``before``, of jobs their shard no longer holds (expired) -> how
        many. The time guard keeps a route whose job is still on its way to its shard."""
        if self.shards <= 1:
            return 0
        n = 0
        for k in self.keys:
            stale: list[tuple[str, int]] = []
            async for name, raw in self.redis.hscan_iter(k.routes, count=500):
                cell, at = route_parts(_s(raw))
                if at < before and 0 <= cell < self.shards:
                    stale.append((_s(name), cell))
            if not stale:
                continue
            pipe = self.redis.pipeline(transaction=False)
            for job, cell in stale:
                pipe.exists(self.keys[cell].job(job))
            gone = [job for (job, _), alive in zip(stale, await pipe.execute(), strict=True) if not alive]
            if gone:
                n += int(await self.redis.hdel(k.routes, *gone))
                self.learnt.forget(gone)
        return n
