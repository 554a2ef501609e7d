"""Client CPU per Redis transition with redis-py's own command packing against hiredis packing
(``shared/state/fastpack.py``), through the store's real batch path: pipelines of ``release`` and
``mark_running`` EVALSHA calls (of unknown jobs: the scripts return at once, so Redis's side stays small) and
``track_command`` HSETs, as the partitioner sends them per fetched batch.

It measures this process's CPU time (``time.process_time``), alternating the two variants, best of
``--repeat``:

    .venv/bin/python -m load.bench_redis_pack --batches 2000 --batch 16 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import Connection

from shared.settings import Settings, load
from shared.state import RedisState
from shared.state.fastpack import HiredisConnection


@contextlib.asynccontextmanager
async def bench_state(tag: str, connection: type[Connection]) -> AsyncIterator[RedisState]:
    """A store on its own namespace with its scripts loaded, wiped and closed afterwards."""
    settings = load(Settings, namespace=tag + uuid.uuid4().hex[:6], metrics_port=0)
    client = aioredis.from_url(settings.redis_url, decode_responses=False, connection_class=connection)
    state = RedisState(client, settings.namespace, settings.shards)
    try:
        await state.load_scripts()
        yield state
    finally:
        await state.wipe()
        await state.close()


async def once(variant: str, batches: int, size: int) -> float:
    async with bench_state("bpack", HiredisConnection if variant == "hiredis" else Connection) as state:
        now = time.time()
        t0 = time.process_time()
        for n in range(batches):
            b = state.batch()
            for i in range(size):
                job = f"bench-{n}-{i}"
                b.release(job, "completed", "exit completed", now, f"node-3/5:1g.5gb@{i % 7}:{job}")
                b.mark_running(job, f"node-3/5:1g.5gb@{i % 7}:{job}", now, f"place:{job}:0")
                b.track_command(0, f"place:{job}:0", {"node": "node-3", "kind": "place", "job": job, "at": now})
            await b.run()
        return (time.process_time() - t0) / (batches * size * 3) * 1e6


async def compared(
    once: Callable[[str], Awaitable[float]], baseline: str, candidate: str, repeat: int, figure: str, digits: int
) -> dict[str, Any]:
    """The lowest figure of each variant over ``repeat`` rounds (the two alternating within each round) and how
    much lower the candidate's is than the baseline's, in %."""
    best: dict[str, float] = {}
    for _ in range(repeat):
        for variant in (baseline, candidate):
            us = await once(variant)
            best[variant] = min(best.get(variant, us), us)
    return {
        figure: {k: round(v, digits) for k, v in best.items()},
        "saved_pct": round(100 * (1 - best[candidate] / best[baseline]), 1),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    return await compared(
        lambda v: once(v, args.batches, args.batch), "python", "hiredis", args.repeat, "client_cpu_us_per_call", 2
    )


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeat", type=int, default=3)
    print(json.dumps(asyncio.run(main(p.parse_args())), indent=2))


if __name__ == "__main__":
    cli()
