"""``MIGSCHED_REDIS_URL`` names one Redis, or a primary behind Sentinel; a URL that cannot be read says why."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster

from shared.state.client import HiredisSentinelConnection, RedisUrlError, redis_client, sentinel_parts

pytestmark = pytest.mark.unit


def test_a_sentinel_url_names_the_sentinels_the_service_the_db_and_the_primarys_credentials() -> None:
    assert sentinel_parts("redis+sentinel://balancer:s%40cret@10.0.0.1:26379,10.0.0.2:26380/migsched/2") == (
        [("10.0.0.1", 26379), ("10.0.0.2", 26380)], "migsched", 2, "balancer", "s@cret")
    assert sentinel_parts("redis+sentinel://127.0.0.1:26379/mymaster") == (
        [("127.0.0.1", 26379)], "mymaster", 0, None, None)


@pytest.mark.parametrize(("url", "why"), [
    ("redis+sentinel://127.0.0.1:26379", "/service"),
    ("redis+sentinel://127.0.0.1:26379/a/b", "/service"),
    ("redis+sentinel://127.0.0.1/svc", "host:port"),
])
def test_an_unreadable_sentinel_url_is_refused_with_the_reason(url: str, why: str) -> None:
    with pytest.raises(RedisUrlError, match=why):
        sentinel_parts(url)


async def test_a_sentinel_client_asks_the_sentinels_for_the_primary_on_each_connection() -> None:
    client = redis_client("redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc/3", decode_responses=False)
    try:
        pool = client.connection_pool
        assert pool.connection_class is HiredisSentinelConnection
        assert pool.service_name == "svc" and pool.connection_kwargs["db"] == 3  # type: ignore[attr-defined]
    finally:
        await client.aclose()


async def test_a_plain_url_gives_a_client_of_that_redis() -> None:
    client = redis_client("redis://127.0.0.1:6390/4")
    try:
        assert client.connection_pool.connection_kwargs["port"] == 6390
        assert client.connection_pool.connection_kwargs["db"] == 4
    finally:
        await client.aclose()


async def test_a_cluster_url_gives_a_cluster_client_seeded_with_every_node_and_the_credentials() -> None:
    c = redis_client("redis+cluster://u:p%40ss@10.0.0.1:7000,10.0.0.2:7001")
    try:
        assert isinstance(c, RedisCluster)
        assert [(n.host, n.port) for n in c.nodes_manager.startup_nodes.values()] == [("10.0.0.1", 7000),
                                                                                        ("10.0.0.2", 7001)]
        assert (c.connection_kwargs["username"], c.connection_kwargs["password"]) == ("u", "p@ss")
    finally:
        await c.aclose()


@pytest.mark.parametrize("url", ["redis+cluster://", "redis+cluster://host", "redis+cluster://h:1,h:port"])
def test_an_unreadable_cluster_url_is_refused_with_the_reason(url: str) -> None:
    with pytest.raises(RedisUrlError, match="each cluster node is host:port"):
        redis_client(url)
