"""The deployment's shard count, recorded where every process of a namespace finds it: a service of another count
is refused (it would look for jobs and nodes in the wrong shards and lose them), and a reader takes the recorded
count instead of assuming one."""

from __future__ import annotations

import pytest

from services.common.testing import private_state
from shared.state.deployment import ShardCountMismatch, claim_shards, recorded_shards, shards_to_use


@pytest.mark.integration
async def test_the_first_service_records_its_count_and_one_of_another_count_is_refused(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with private_state(prefix, nats_url, redis_url, shards=2) as first, \
            private_state(prefix, nats_url, redis_url, shards=1) as other:
        assert await recorded_shards(first.redis, prefix) is None
        await first.claim_shards()
        await first.claim_shards()  # a restart, or a replica, of the same count
        assert await recorded_shards(other.redis, prefix) == 2
        with pytest.raises(ShardCountMismatch) as refused:
            await other.claim_shards()
        assert (refused.value.configured, refused.value.recorded) == (1, 2)
        assert f"MIGSCHED_SHARDS=1, but namespace {prefix!r} runs 2 shard(s)" in str(refused.value)
        assert "set MIGSCHED_SHARDS=2" in str(refused.value)
        assert await recorded_shards(first.redis, prefix) == 2  # the refused one changed nothing


@pytest.mark.integration
async def test_a_reader_takes_the_recorded_count_and_refuses_another_one_asked_for(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with private_state(prefix, nats_url, redis_url, shards=4) as store:
        r = store.redis
        assert await shards_to_use(r, prefix, None) == 1  # nothing recorded, nothing asked: one shard
        assert await shards_to_use(r, prefix, None, default=3) == 3
        assert await shards_to_use(r, prefix, 2) == 2
        await store.claim_shards()
        assert await shards_to_use(r, prefix, None) == 4
        assert await shards_to_use(r, prefix, 4) == 4
        with pytest.raises(ShardCountMismatch):
            await shards_to_use(r, prefix, 2)


@pytest.mark.integration
async def test_a_wipe_of_the_namespace_forgets_its_count(prefix: str, nats_url: str, redis_url: str) -> None:
    async with private_state(prefix, nats_url, redis_url, shards=2) as store:
        await store.claim_shards()
        await store.wipe()
        assert await recorded_shards(store.redis, prefix) is None
        await claim_shards(store.redis, prefix, 3)  # an emptied namespace may start again with another count
        assert await recorded_shards(store.redis, prefix) == 3
