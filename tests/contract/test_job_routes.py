"""Jobs routed away from their home shard, on both stores: a job lives in the shard of crc32 of its id unless the
balancer routed it, before any record of it existed, to a shard whose GPUs could host it (``lua/route.lua``).
Every process then finds it there: its transitions, its reads and its queue. The first route of a job wins, a
job already recorded at home stays there, and the registry forgets the routes of expired jobs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from services.common.testing import make_settings, private_state
from shared.state import RedisState, Reservation, StoredInstance, audit
from shared.state.memory_store import MemoryState
from shared.state.sharding import shard_of
from tests.contract.state_cases.expiry import GEO, LATER, NOW

pytestmark = pytest.mark.timeout(30)
Make = Callable[[], Awaitable[Any]]


@pytest.fixture(params=[pytest.param("memory", marks=pytest.mark.unit),
                        pytest.param("redis", marks=pytest.mark.integration),
                        pytest.param("redis-cluster", marks=[pytest.mark.integration, pytest.mark.ha])])
async def process(request: pytest.FixtureRequest, prefix: str) -> AsyncIterator[Make]:
    """Makes one process's store of a two-shard deployment: each call a new ``RedisState`` on this test's
    namespace (so nothing learnt in one is known to the next), or the one ``MemoryState``."""
    memory = MemoryState(shards=2)
    opened: list[Any] = []

    async def make() -> Any:
        if request.param == "memory":
            return memory
        url = (request.getfixturevalue("redis_cluster").url if request.param == "redis-cluster"
               else request.getfixturevalue("redis_url"))
        cm = private_state(prefix, request.getfixturevalue("nats_url"), url, shards=2)
        opened.append(cm)
        return await cm.__aenter__()

    yield make
    for cm in reversed(opened):
        await cm.__aexit__(None, None, None)


def job_at_home(home: int, n: int = 0) -> str:
    """The ``n``-th job id whose home (crc32) is shard ``home`` of two."""
    ids = (f"job-{k}" for k in range(1000))
    return [j for j in ids if shard_of(j, 2) == home][n]


def gpu(node: str) -> dict[str, Any]:
    return {"id": f"{node}/0", "index": 0, "model": "A100-40GB", "mig": False, "healthy": True,
            "uuid": f"GPU-{node}", "instances": [], "replicas": 0, "jobs": []}


async def node_in(store: Any, shard: int) -> str:
    """A node registered in ``shard`` (by its block label: the first block goes to its name's shard)."""
    for k in range(100):
        node = f"node-{k}"
        await store.register_node(node, [gpu(node)], NOW, f"reg-{node}", labels={"block": f"blk-{k}"})
        if store.node_shard(node) == shard:
            return node
    raise AssertionError(f"no node landed in shard {shard}")


async def a_routed_job_is_found_in_its_shard_by_every_process(make: Make) -> None:
    balancer, other = await make(), await make()
    job = job_at_home(0)
    assert await balancer.route({job: 1}, NOW) == {job: 1}
    assert await balancer.enqueue(job, b"{}", 0, NOW, "waits", NOW) == "queued"
    assert await balancer.pending_ids(1) == [job] and await balancer.pending_ids(0) == []
    got = await other.job(job)
    assert got is not None and got.state == "pending"
    assert other.job_shard(job) == 1
    assert await other.settle(job, "rejected", "changed its mind", NOW + 1, ("pending",)) == "ok"
    assert [h.to for h in await balancer.history(job)] == ["pending", "rejected"]
    assert await balancer.all_job_ids(0) == [] and await balancer.all_job_ids(1) == [job]


async def a_routed_job_reserves_runs_and_ends_in_its_shard_whoever_sends_the_transition(make: Make) -> None:
    balancer = await make()
    node = await node_in(balancer, 1)
    job = job_at_home(0)
    await balancer.route({job: 1}, NOW)
    (g,) = await balancer.get_gpus([f"{node}/0"])
    whole = StoredInstance(id=f"{node}/0:gpu:{job}", profile="gpu", start=0, size=8, compute=7)
    r = Reservation(job_id=job, gpu_id=g.id, expected_ver=g.ver, instance=whole, action="create", max_count=1,
                    spec=b"{}", submitted_at=NOW)
    assert (await balancer.reserve(r, NOW)).ok
    replica = await make()  # a process of its own has learnt nothing: it sends to the job's home first
    res = await replica.reserve(r, NOW + 1)  # the decision is not sent on: it is lost, and made again
    assert res.status == ("known" if replica is balancer else "routed") and replica.job_shard(job) == 1
    registry = await make()
    assert await registry.mark_running(job, whole.id, NOW + 2) == "ok"
    assert registry.job_shard(job) == 1
    assert (await registry.release(job, "completed", "done", NOW + 3, whole.id, node)).state == "finished"
    assert await audit(balancer, GEO) == []


async def the_first_route_of_a_job_wins(make: Make) -> None:
    one, two = await make(), await make()
    job = job_at_home(0)
    assert await one.route({job: 1}, NOW) == {job: 1}
    assert await two.route({job: 0}, NOW + 1) == {job: 1}  # another replica, or a redelivered submit
    assert await two.enqueue(job, b"{}", 0, NOW, "waits", NOW) == "queued"
    assert await one.enqueue(job, b"{}", 0, NOW, "waits", NOW) == "pending"  # the record is there already
    assert await one.pending_count() == 1


async def a_job_already_recorded_at_home_stays_there(make: Make) -> None:
    store = await make()
    job = job_at_home(1)
    assert await store.enqueue(job, b"{}", 0, NOW, "waits", NOW) == "queued"
    assert await store.route({job: 0}, NOW) == {job: 1}
    assert await store.pending_ids(1) == [job] and await store.pending_ids(0) == []


async def the_routes_of_expired_jobs_are_forgotten_and_no_others(make: Make) -> None:
    store = await make()
    gone, alive, fresh = job_at_home(0, 0), job_at_home(0, 1), job_at_home(0, 2)
    await store.route({gone: 1, alive: 1}, NOW)
    await store.route({fresh: 1}, NOW + 100)  # its record is still on its way
    for job in (gone, alive):
        assert await store.enqueue(job, b"{}", 0, NOW, "waits", NOW) == "queued"
    assert await store.settle(gone, "rejected", "never fits", NOW + 1, ("pending",)) == "ok"
    assert await store.expire(1, LATER, 100) == 1
    assert await store.prune_routes(NOW + 50) == 1
    later = await make()
    assert later.job_shard(gone) == 0  # a new job under that id is routed afresh
    assert await later.job(alive) is not None and later.job_shard(alive) == 1
    assert await later.route({fresh: 0}, NOW + 200) == {fresh: 1}


CASES = [a_routed_job_is_found_in_its_shard_by_every_process,
         a_routed_job_reserves_runs_and_ends_in_its_shard_whoever_sends_the_transition,
         the_first_route_of_a_job_wins, a_job_already_recorded_at_home_stays_there,
         the_routes_of_expired_jobs_are_forgotten_and_no_others]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
async def test_both_stores_route_jobs_alike(case: Callable[[Make], Awaitable[None]], process: Make) -> None:
    await case(process)


@pytest.mark.integration
async def test_a_routed_jobs_shard_is_read_from_its_home_without_being_learnt(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with private_state(prefix, nats_url, redis_url, shards=2) as store:
        routed, stays = job_at_home(0, 0), job_at_home(0, 1)
        await store.route({routed: 1}, NOW)
        reader = RedisState.from_settings(make_settings(prefix, nats_url, redis_url, shards=2))
        try:
            assert await reader.routes.shards_of([routed, stays]) == {routed: 1, stays: 0}
            assert reader.routes.learnt.unknown([routed]) == [routed]  # read, not remembered
        finally:
            await reader.close()
