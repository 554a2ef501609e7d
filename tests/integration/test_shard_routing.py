"""Which shard a job lives in, through the live services on real NATS + Redis with scripted executors: a block's
nodes share a shard and a gang within it fits in one script; a gang bigger than every shard is refused at submit,
one too big for its home goes to a shard that can host it; a new job its full home cannot place goes where there
is room, one whose home holds no GPU where there are some, and a large job no shard can place now waits where it
is expected to start soonest."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from plain_cluster import GANG_TENANCY, GEO, Env, in_blocks, routed, scripted_cluster, submit, until

from migsched import clusterview
from services.common.testing import make_settings
from shared.events import Demand, JobSubmit, now
from shared.state import RedisState, shard_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_with_several_shards_a_blocks_nodes_share_its_shard_and_a_gang_fits_in_one_script(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    blocks = {"n1": "b1", "n2": "b1", "n3": "b2", "n4": "b2"}
    async with scripted_cluster(prefix, nats_url, redis_url, in_blocks(blocks), shards=4) as e:
        fresh = RedisState.from_settings(make_settings(prefix, nats_url, redis_url, shards=4))
        try:
            await fresh.nodes()  # another process learns where each node lives from the shards themselves
            where = {node: fresh.node_shard(node) for node in blocks}
            assert where["n1"] == where["n2"] != where["n3"] == where["n4"]  # one shard per block
            for ex in e.nodes:  # heartbeats land on the node records in their block's shard
                await ex.heartbeat()
            seen = await fresh.nodes()
            assert sorted(seen) == sorted(blocks) and all(h.get("state") == "up" for h in seen.values())
            assert (await clusterview.read(fresh, GEO)).blocks == blocks  # what `migsched status` lists
        finally:
            await fresh.close()
        # a gang of four in the shard of b1's nodes (the job's shard is its id's)
        job_id = next(f"g{i}" for i in range(1000) if shard_of(f"g{i}", 4) == where["n1"])
        await e.submit(submit(job_id, Demand(kind="gpus", gpus=4)))
        assert await until(e.all_in([job_id], "running"))
        job = await e.ns.state.job(job_id)
        assert job is not None and {g.rpartition("/")[0] for g, _ in job.slots} == {"n1", "n2"}
        await e.clean()


async def test_a_gang_bigger_than_every_shard_is_rejected_at_submit_with_its_reason(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    blocks = {"n1": "b0", "n2": "b0", "n3": "b1", "n4": "b1"}  # names whose crc32 agree modulo 2
    async with scripted_cluster(prefix, nats_url, redis_url, in_blocks(blocks), shards=2) as e:
        await e.ns.state.nodes()
        assert e.ns.state.node_shard("n3") != e.ns.state.node_shard("n1")  # each block a shard of its own
        await e.submit(submit("g", Demand(kind="gpus", gpus=6)))  # 8 GPUs in all, 4 in each shard
        assert await until(e.all_in(["g"], "rejected"))
        job = await e.ns.state.job("g")
        assert job is not None
        assert "needs 6 GPUs; the largest shard has 4 (a gang runs within one shard)" in job.reason
        await e.clean()


async def test_a_gang_too_big_for_its_home_shard_runs_in_a_shard_that_can_host_it(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    blocks = {"n1": "big", "n2": "small", "n3": "big", "n4": "big"}  # the first node's block gets shard 0 or 1
    async with scripted_cluster(prefix, nats_url, redis_url, in_blocks(blocks), shards=2) as e:
        await e.ns.state.nodes()
        big, small = e.ns.state.node_shard("n1"), e.ns.state.node_shard("n2")
        assert big != small
        job_id = next(f"g{i}" for i in range(1000) if shard_of(f"g{i}", 2) == small)
        before = routed("never_fits")
        await e.submit(submit(job_id, Demand(kind="gpus", gpus=6)))  # 6 GPUs in its home's block, 2 in the other
        assert await until(e.all_in([job_id], "running"))
        assert routed("never_fits") == before + 1
        job = await e.ns.state.job(job_id)
        assert job is not None and {g.rpartition("/")[0] for g, _ in job.slots} == {"n1", "n3", "n4"}
        assert await e.ns.state.pending_count() == 0 and await e.ns.state.all_job_ids(small) == []
        await e.clean()


@pytest.mark.parametrize("tenancy", [False, True], ids=["plain", "tenancy"])
async def test_a_new_job_its_full_home_shard_cannot_place_runs_in_a_shard_with_room(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path, tenancy: bool
) -> None:
    blocks = {"n1": "a", "n2": "b"}  # a shard each, two GPUs each
    extra: dict[str, Any] = {}
    if tenancy:  # one tenant, one class: no job may preempt another, so the home shard holds it for capacity
        (tmp_path / "tenancy.toml").write_text(GANG_TENANCY)
        extra = {"tenancy_file": str(tmp_path / "tenancy.toml")}
    async with scripted_cluster(prefix, nats_url, redis_url, in_blocks(blocks), shards=2, **extra) as e:
        await e.ns.state.nodes()
        home = e.ns.state.node_shard("n1")
        jobs = [j for j in (f"j{i}" for i in range(1000)) if shard_of(j, 2) == home][:3]
        for job in jobs[:2]:
            await e.submit(submit(job, Demand(kind="gpus", gpus=1), tenant="team"))
        assert await until(e.all_in(jobs[:2], "running"))
        before = routed("no_room_now")
        await e.submit(submit(jobs[2], Demand(kind="gpus", gpus=1), tenant="team"))
        assert await until(e.all_in(jobs[2:3], "running"))  # its home is full: it runs on the other shard's node
        assert routed("no_room_now") == before + 1
        third = await e.ns.state.job(jobs[2])
        assert third is not None and third.node == "n2"
        await e.clean()


async def test_a_job_whose_home_shard_holds_no_gpu_runs_in_one_that_does(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    shards = 4
    blocks = {"n1": "b0", "n2": "b0"}  # every node in one shard: three shards hold none
    async with scripted_cluster(prefix, nats_url, redis_url, in_blocks(blocks), shards=shards) as e:
        await e.ns.state.nodes()
        home = e.ns.state.node_shard("n1")
        elsewhere = next(f"j{i}" for i in range(1000) if shard_of(f"j{i}", shards) != home)
        placed = next(f"j{i}" for i in range(1000) if shard_of(f"j{i}", shards) == home)
        await e.submit(submit(elsewhere, Demand(kind="gpus", gpus=1)), submit(placed, Demand(kind="gpus", gpus=1)))
        assert await until(e.all_in([placed, elsewhere], "running"))
        assert sorted(await e.ns.state.all_job_ids(home)) == sorted([placed, elsewhere])
        await e.clean()


def _hinted(job: str, gpus: int, hint_s: float) -> JobSubmit:
    return JobSubmit(id=f"s-{job}", job_id=job, demand=Demand(kind="gpus", gpus=gpus), duration_hint_s=hint_s,
                     submitted_at=now())


@pytest.fixture
async def slow_and_quick(prefix: str, nats_url: str, redis_url: str) -> AsyncIterator[tuple[Env, int, int]]:
    """Two shards of a node of two whole GPUs each, both busy: the slow shard's jobs end in an hour, the quick
    one's in a minute (their hints). Yields the cluster and the two shards."""
    async with scripted_cluster(prefix, nats_url, redis_url, in_blocks({"n1": "a", "n2": "b"}), shards=2) as e:
        await e.ns.state.nodes()
        slow, quick = e.ns.state.node_shard("n1"), e.ns.state.node_shard("n2")
        (on_slow,), (on_quick,) = _homed(slow, 1, skip=0), _homed(quick, 1, skip=0)
        await e.submit(_hinted(on_slow, 2, 3600.0), _hinted(on_quick, 2, 60.0))
        assert await until(e.all_in([on_slow, on_quick], "running"))
        assert {(await e.ns.state.job(j)).node for j in (on_slow, on_quick)} == {"n1", "n2"}  # type: ignore[union-attr]
        yield e, slow, quick
        await e.clean()


def _homed(shard: int, n: int, skip: int = 1) -> list[str]:
    """``n`` job ids whose home is ``shard`` of two, past the first ``skip`` (the fixture's running job's)."""
    ids = [j for j in (f"j{i}" for i in range(1000)) if shard_of(j, 2) == shard]
    return ids[skip:skip + n]


async def test_a_large_job_no_shard_can_place_now_waits_in_the_shard_whose_gpus_free_soonest(
    slow_and_quick: tuple[Env, int, int],
) -> None:
    e, slow, quick = slow_and_quick
    (waits,), (stays,) = _homed(slow, 1), _homed(quick, 1)
    before = routed("sooner_elsewhere")
    await e.submit(_hinted(waits, 2, 600.0))  # its home's GPUs free in an hour, the other shard's in a minute
    assert await until(e.all_in([waits], "pending"))
    assert routed("sooner_elsewhere") == before + 1
    assert waits in await e.ns.state.all_job_ids(quick) and waits not in await e.ns.state.all_job_ids(slow)
    job = await e.ns.state.job(waits)  # the counts in its reason are its shard's: the reason says which
    assert job is not None and job.reason.startswith(f"cannot place in shard {quick} of 2: "), job.reason
    await e.submit(_hinted(stays, 2, 600.0))  # its home is the shard that frees first: it waits there
    assert await until(e.all_in([stays], "pending"))
    assert routed("sooner_elsewhere") == before + 1
    assert stays in await e.ns.state.all_job_ids(quick)


async def test_large_jobs_arriving_together_wait_where_each_would_start_soonest_behind_the_others(
    slow_and_quick: tuple[Env, int, int],
) -> None:
    e, slow, quick = slow_and_quick
    first, second = _homed(slow, 2)
    # both at home where GPUs free in an hour; elsewhere in a minute, but then the first runs two hours there
    await e.submit(_hinted(first, 2, 7200.0), _hinted(second, 2, 7200.0))
    assert await until(e.all_in([first, second], "pending"))
    assert first in await e.ns.state.all_job_ids(quick)
    assert second in await e.ns.state.all_job_ids(slow)  # behind the first, its home is sooner
