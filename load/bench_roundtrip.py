"""Client CPU per pipelined Redis round trip: redis-py's ``Pipeline`` (as the store used it until 30 Nov 2026:
hiredis packing, ``asyncio.wait_for`` per write) against the store's ``RoundTrips`` (``shared/state/roundtrip.py``)
on ``shared/state/fastpack.py`` connections, both sending the batches the partitioner sends (``release``,
``mark_running`` and ``track_command`` of unknown jobs: the scripts return at once, so Redis's side stays small).

At 1,000 jobs/s the live stack makes ~600 such round trips per second of 2-4 calls each, so the per-trip cost,
not the per-call one, is what this compares. It measures this process's CPU time (``time.process_time``) under
uvloop, as the services run, alternating the variants, best of ``--repeat``:

    .venv/bin/python -m load.bench_roundtrip --trips 5000 --batch 3 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from redis.asyncio.connection import Connection
from redis.typing import EncodableT

from load.bench_redis_pack import bench_state, compared
from shared.state import RedisState
from shared.state.fastpack import HiredisConnection, _hiredis_pack


class PackOnlyConnection(Connection):
    """The store's connection before ``RoundTrips``: hiredis packing, redis-py's own send."""

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        return _hiredis_pack(self, args) or super().pack_command(*args)


def calls(state: RedisState, trip: int, size: int, now: float) -> list[tuple[Any, ...]]:
    b = state.batch()
    for i in range(size):
        job = f"bench-{trip}-{i}"
        if i % 3 == 0:
            b.release(job, "completed", "exit completed", now, f"node-3/5:1g.5gb@{i % 7}:{job}")
        elif i % 3 == 1:
            b.mark_running(job, f"node-3/5:1g.5gb@{i % 7}:{job}", now, f"place:{job}:0")
        else:
            b.track_command(0, f"place:{job}:0", {"node": "node-3", "kind": "place", "job": job, "at": now})
    return b.commands()


async def once(variant: str, trips: int, size: int) -> float:
    async with bench_state("brt", PackOnlyConnection if variant == "pipeline" else HiredisConnection) as state:
        now = time.time()
        batches = [calls(state, n, size, now) for n in range(trips)]
        t0 = time.process_time()
        for cmds in batches:
            if variant == "pipeline":
                pipe = state.redis.pipeline(transaction=False)
                for c in cmds:
                    pipe.execute_command(*c)
                raw = await pipe.execute(raise_on_error=False)
            else:
                raw = await state.roundtrips.run(cmds)
            assert len(raw) == len(cmds) and not any(isinstance(v, Exception) for v in raw), raw
        return (time.process_time() - t0) / trips * 1e6


async def main(args: argparse.Namespace) -> dict[str, Any]:
    return await compared(lambda v: once(v, args.trips, args.batch), "pipeline", "roundtrips", args.repeat,
                          "client_cpu_us_per_round_trip", 1)


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trips", type=int, default=5000, help="round trips per variant and round")
    p.add_argument("--batch", type=int, default=3, help="calls per round trip (2-4 at 1,000 jobs/s)")
    p.add_argument("--repeat", type=int, default=3, help="rounds; the best of each variant is kept")
    args = p.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # the services run on uvloop when it is there; the figures are for that
        pass
    print(json.dumps(asyncio.run(main(args)), indent=2))


if __name__ == "__main__":
    cli()
