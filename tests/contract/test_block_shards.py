"""Which shard a topology block's nodes live in, on both stores: the block's first node chooses it (the shard
holding the fewest blocks), every later node of the block follows, and a handful of blocks spread over as many
shards, whatever their names. With crc32 of the name alone, blocks ``b0`` and ``b1`` both went to shard 0 of
two, and the jobs whose ids fell in shard 1 could never run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from services.common.testing import private_state
from shared.state import RedisState
from shared.state.memory_store import MemoryState
from shared.state.sharding import block_order, block_shard, shard_of

NOW = 1000.0
Make = Callable[[int], Awaitable[Any]]


@pytest.fixture(params=[pytest.param("memory", marks=pytest.mark.unit),
                        pytest.param("redis", marks=pytest.mark.integration)])
async def make(request: pytest.FixtureRequest, prefix: str) -> AsyncIterator[Make]:
    """Makes a store of the given shard count: ``MemoryState``, or ``RedisState`` on this test's keys (a second
    one made shares the first one's namespace, as two registries of one deployment do)."""
    opened: list[Any] = []

    async def store(shards: int) -> Any:
        if request.param == "memory":
            return MemoryState(shards=shards)
        cm = private_state(prefix, request.getfixturevalue("nats_url"), request.getfixturevalue("redis_url"),
                           shards=shards)
        opened.append(cm)
        return await cm.__aenter__()

    yield store
    for cm in reversed(opened):
        await cm.__aexit__(None, None, None)


def gpu(node: str) -> dict[str, Any]:
    return {"id": f"{node}/0", "index": 0, "model": "A100-40GB", "mig": False, "healthy": True,
            "uuid": f"GPU-{node}", "instances": [], "replicas": 0, "jobs": []}


async def register(store: Any, node: str, block: str | None) -> int:
    await store.register_node(node, [gpu(node)], NOW, f"reg-{node}", labels={"block": block} if block else {})
    return int(store.node_shard(node))


async def test_blocks_whose_names_hash_alike_still_spread_over_every_shard(make: Make) -> None:
    store = await make(2)
    shards = {b: await register(store, f"n-{b}", b) for b in ("b0", "b1")}
    assert sorted(shards.values()) == [0, 1]
    store4 = await make(4)
    assert sorted([await register(store4, f"m{i}", f"b{i}") for i in range(4)]) == [0, 1, 2, 3]


async def test_every_node_of_a_block_follows_its_first_node(make: Make) -> None:
    store = await make(3)
    first = {b: await register(store, f"{b}-1", b) for b in ("rack-a", "rack-b", "rack-c")}
    assert sorted(first.values()) == [0, 1, 2]
    for b, shard in first.items():
        assert [await register(store, f"{b}-{k}", b) for k in (2, 3)] == [shard, shard]
    # a registration again keeps the node where it is
    assert await register(store, "rack-a-1", "rack-a") == first["rack-a"]


async def test_more_blocks_than_shards_fill_the_shards_evenly(make: Make) -> None:
    store = await make(2)
    got = [await register(store, f"n{i}", f"block-{i}") for i in range(5)]
    assert sorted(got.count(s) for s in (0, 1)) == [2, 3]


async def test_a_node_without_a_block_lives_in_its_names_shard(make: Make) -> None:
    store = await make(4)
    await register(store, "a1", "a")
    assert await register(store, "loose-node", None) == shard_of("loose-node", 4)


async def test_two_registries_racing_on_new_blocks_agree_and_still_spread(make: Make) -> None:
    one, other = await make(2), await make(2)
    if isinstance(one, MemoryState):
        other = one  # one process's store: the race is the Redis script's
    # the first nodes of two new blocks whose names hash alike, registered at once through both: the block map
    # changes atomically, so the second block sees the first and takes the other shard
    two = await asyncio.gather(register(one, "y1", "b0"), register(other, "z1", "b1"))
    assert sorted(two) == [0, 1]
    # the first nodes of one new block, at once through both: one shard
    same = await asyncio.gather(register(one, "x1", "x"), register(other, "x2", "x"))
    assert same[0] == same[1]
    if isinstance(other, RedisState):
        await other.locate(["y1"])  # a node another process registered: learnt from the shards, as any process does
        assert other.node_shard("y1") == two[0]


def test_the_rule_takes_the_least_loaded_shard_and_breaks_ties_in_the_blocks_own_order() -> None:
    order = block_order("b7", 4)
    assert order[0] == shard_of("b7", 4) and sorted(order) == [0, 1, 2, 3]
    assert block_shard("b7", [0, 0, 0, 0]) == order[0]
    assert block_shard("b7", [1 if s == order[0] else 0 for s in range(4)]) == order[1]
    assert block_shard("b7", [2, 1, 2, 2]) == 1
