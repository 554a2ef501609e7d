"""A GPU's instances live in one hash field each (``i:<instance id>``): a transition writes only the instances it
changes, and a GPU written by an older version (its whole list in ``inst``) is read as it is and converted on
its first write."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio as aioredis

from services.common.testing import make_settings
from shared.mig.geometry import default_geometry
from shared.state import RedisState, Reservation, StoredInstance, audit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]
GEO = default_geometry()
A100 = GEO.model("A100-40GB")
IDLE = {"id": "n1/0:1g.5gb@0:old", "profile": "1g.5gb", "start": 0, "size": 1, "compute": 1}


@pytest.fixture
async def state(prefix: str, redis_url: str, nats_url: str) -> AsyncIterator[RedisState]:
    st = RedisState.from_settings(make_settings(prefix, nats_url, redis_url))
    yield st
    await st.wipe()
    await st.close()


def gpu(index: int, instances: list[dict] | None = None) -> dict:  # type: ignore[type-arg]
    return {
        "id": f"n1/{index}",
        "index": index,
        "model": "A100-40GB",
        "mig": True,
        "healthy": True,
        "uuid": "",
        "instances": instances or [],
    }


def res(job: str, profile: str, start: int, ver: int) -> Reservation:
    p = A100.profile(profile)
    inst = StoredInstance(
        id=f"n1/0:{profile}@{start}:{job}", profile=profile, start=start, size=p.memory_slices, compute=p.compute_slices
    )
    return Reservation(
        job_id=job,
        gpu_id="n1/0",
        expected_ver=ver,
        instance=inst,
        action="create",
        destroy=(),
        max_count=p.max_count,
        spec=b"{}",
        prio=0,
        submitted_at=1.0,
        reason="test",
    )


async def gpu_writes(redis_url: str, key: str, action: Callable[[], Awaitable[object]]) -> list[str]:
    """The write commands Redis ran on ``key`` while ``action`` ran (MONITOR shows a script's own calls)."""
    mon = aioredis.from_url(redis_url)
    marker = f"end-of-{key}"
    seen: list[str] = []
    try:
        async with mon.monitor() as m:
            done = asyncio.Event()

            async def collect() -> None:
                async for c in m.listen():
                    seen.append(c["command"])
                    if marker in c["command"]:
                        done.set()

            task = asyncio.create_task(collect())
            other = aioredis.from_url(redis_url)
            await other.ping()  # the monitor is attached once its first command is seen
            await action()
            await other.echo(marker)
            await asyncio.wait_for(done.wait(), 10)
            await other.aclose()
            task.cancel()
    finally:
        await mon.aclose()
    return [c for c in seen if key in c and c.split(" ", 1)[0] in ("HSET", "HDEL")]


async def test_a_transition_writes_only_the_instances_it_changes(state: RedisState, redis_url: str) -> None:
    await state.register_node("n1", [gpu(0, [IDLE])], time.time())
    key = state.keys(0).gpu("n1/0")
    assert json.loads(await state.redis.hget(key, f"i:{IDLE['id']}")) == {**IDLE, "state": "idle"}  # type: ignore[arg-type]
    assert not await state.redis.hexists(key, "inst")

    writes = await gpu_writes(redis_url, key, lambda: state.reserve(res("j1", "3g.20gb", 4, ver=1), time.time()))
    assert len(writes) == 1 and "i:n1/0:3g.20gb@4:j1" in writes[0] and IDLE["id"] not in writes[0]

    writes = await gpu_writes(redis_url, key, lambda: state.mark_running("j1", "n1/0:3g.20gb@4:j1", time.time()))
    assert len(writes) == 1 and "i:n1/0:3g.20gb@4:j1" in writes[0] and IDLE["id"] not in writes[0]

    async def release() -> None:
        r = await state.release("j1", "completed", "done", time.time())
        # the GPU handed back with the release holds both instances, the unchanged one as it was stored
        assert r.status == "ok" and r.gpu is not None
        assert [(i.id, i.state) for i in r.gpu.instances] == [(IDLE["id"], "idle"), ("n1/0:3g.20gb@4:j1", "idle")]

    writes = await gpu_writes(redis_url, key, release)
    assert len(writes) == 1 and "i:n1/0:3g.20gb@4:j1" in writes[0] and IDLE["id"] not in writes[0]


async def test_a_removed_instance_loses_its_field(state: RedisState) -> None:
    await state.register_node("n1", [gpu(0, [IDLE])], time.time())
    key = state.keys(0).gpu("n1/0")
    assert await state.instance("retire", "n1", "n1/0", IDLE["id"], time.time()) == "ok"
    assert await state.instance("drop", "n1", "n1/0", IDLE["id"], time.time()) == "ok"
    assert [f for f in await state.redis.hkeys(key) if f.startswith(b"i:")] == []
    (g,) = await state.get_gpus(["n1/0"])
    assert g is not None and g.instances == []


async def test_a_gpu_written_by_an_older_version_is_read_and_converted_on_its_first_write(
    state: RedisState,
) -> None:
    await state.register_node("n1", [gpu(0)], time.time())
    key = state.keys(0).gpu("n1/0")
    # as an older version stored it: the whole list in one field
    await state.redis.hset(key, "inst", json.dumps([{**IDLE, "state": "idle"}]))
    (g,) = await state.get_gpus(["n1/0"])
    assert g is not None and [i.id for i in g.instances] == [IDLE["id"]]

    # the reservation sees the old instance (an overlap at slice 0 is refused) and converts the hash
    ver = g.ver
    assert (await state.reserve(res("j0", "1g.5gb", 0, ver=ver), time.time())).status == "overlap"
    assert (await state.reserve(res("j1", "3g.20gb", 4, ver=ver), time.time())).ok
    fields = {f.decode() for f in await state.redis.hkeys(key)}
    assert "inst" not in fields and {f"i:{IDLE['id']}", "i:n1/0:3g.20gb@4:j1"} <= fields
    (g,) = await state.get_gpus(["n1/0"])
    assert g is not None and [i.id for i in g.instances] == [IDLE["id"], "n1/0:3g.20gb@4:j1"]
    assert await audit(state, GEO) == []
