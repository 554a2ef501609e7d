"""Two services (or replicas) can never double-book a slice: many clients race on one GPU through the real
Lua compare-and-set, and the invariants hold after every round."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from services.common.testing import make_settings
from shared.mig.geometry import default_geometry
from shared.mig.occupancy import free_starts
from shared.state import RedisState, Reservation, StoredInstance, audit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
GEO = default_geometry()
A100 = GEO.model("A100-40GB")
PROFILES = ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "1g.10gb"]


async def racer(st: RedisState, name: str, rounds: int, rng: random.Random, wins: list[str]) -> None:
    for n in range(rounds):
        (g,) = await st.get_gpus(["n1/0"])
        assert g is not None
        busy = [i for i in g.instances if i.state != "idle"]
        if busy and rng.random() < 0.3:  # someone's job ends: release it (idempotent if another racer did)
            victim = rng.choice(busy)
            await st.release(victim.job or "", "completed", "done", time.time(), victim.id)
            continue
        prof = A100.profile(rng.choice(PROFILES))
        starts = free_starts(prof, g.busy_mask)  # idle instances in the way are destroyed by the placement
        if not starts:
            continue
        start = rng.choice(starts)
        pm = ((1 << prof.memory_slices) - 1) << start
        destroy = tuple(i.id for i in g.instances if i.state == "idle" and i.mask & pm)
        job = f"{name}-{n}"
        inst = StoredInstance(
            id=f"n1/0:{prof.name}@{start}:{job}",
            profile=prof.name,
            start=start,
            size=prof.memory_slices,
            compute=prof.compute_slices,
        )
        r = await st.reserve(
            Reservation(
                job_id=job,
                gpu_id="n1/0",
                expected_ver=g.ver,
                instance=inst,
                action="create",
                destroy=destroy,
                max_count=prof.max_count,
                spec=b"{}",
            ),
            time.time(),
        )
        if r.ok:
            wins.append(job)


async def test_concurrent_reservations_on_one_gpu_never_overlap(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    settings = make_settings(prefix, nats_url, redis_url)
    stores = [RedisState.from_settings(settings) for _ in range(12)]
    await stores[0].register_node(
        "n1",
        [
            {
                "id": "n1/0",
                "index": 0,
                "model": "A100-40GB",
                "mig": True,
                "healthy": True,
                "uuid": "",
                "instances": [],
            }
        ],
        time.time(),
    )
    wins: list[str] = []
    try:
        for round_ in range(3):
            await asyncio.gather(
                *(
                    racer(st, f"r{round_}-{k}", 25, random.Random(round_ * 100 + k), wins)
                    for k, st in enumerate(stores)
                )
            )
            assert await audit(stores[0], GEO) == []
            (g,) = await stores[0].get_gpus(["n1/0"])
            assert g is not None
            seen = 0
            for i in g.instances:
                assert not (i.mask & seen)
                seen |= i.mask
        assert len(wins) > 10  # the race really happened, and many won
        jobs = [j for j in await stores[0].jobs(wins) if j is not None]
        assert {j.state for j in jobs} <= {"placing", "finished"}
    finally:
        await stores[0].wipe()
        for st in stores:
            await st.close()
