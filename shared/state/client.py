"""The Redis client for ``MIGSCHED_REDIS_URL``: one Redis, or the primary a Sentinel quorum names.

- ``redis://[user:password@]host:port/db``, ``rediss://...`` (TLS) and ``unix:///path?db=0`` as redis-py reads
  them;
- ``redis+cluster://[user:password@]host:port[,host:port...]``: a Redis Cluster, any of its nodes as seeds. Each
  shard's keys share a hash tag, so every transition runs in one slot (``cluster_roundtrip``).
- ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``: the primary of ``service`` as the
  sentinels at those addresses name it. The credentials are the primary's (the sentinels themselves take none).
  A connection asks the sentinels again whenever it reconnects, and one still open to a primary that was demoted
  (``READONLY``) is closed and retried, so after a failover every transition goes to the new primary.

Every connection packs its commands with hiredis (``fastpack``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlparse

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel, SentinelManagedConnection

from shared.errors import MigschedError
from shared.state.fastpack import _FastSend, connection_class

SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"


class RedisUrlError(MigschedError):
    """``MIGSCHED_REDIS_URL`` cannot be read."""


class HiredisSentinelConnection(_FastSend, SentinelManagedConnection):
    async def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        # redis-py (8.1) reconnects a connection it holds (a retry after a broken one, our round trips) through
        # this method, not through ``connect``, which alone asks the sentinels: without this a connection to a
        # primary that died would knock on its address forever after the failover.
        if self.is_connected:
            return
        if self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)


def sentinel_parts(url: str) -> tuple[list[tuple[str, int]], str, int, str | None, str | None]:
    """(sentinel addresses, service name, db, username, password) of a ``redis+sentinel://`` URL."""
    u = urlparse(url)
    hosts = u.netloc.rsplit("@", 1)[-1]
    addresses: list[tuple[str, int]] = []
    for part in hosts.split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit():
            raise RedisUrlError(f"{url!r}: each sentinel is host:port, got {part!r}")
        addresses.append((host.strip("[]"), int(port)))
    path = [p for p in u.path.split("/") if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise RedisUrlError(f"{url!r}: the path is /service or /service/db (the primary's name as the sentinels "
                            "monitor it)")
    user = unquote(u.netloc.split("@", 1)[0].partition(":")[0]) if "@" in u.netloc else None
    password = unquote(u.netloc.split("@", 1)[0].partition(":")[2]) if "@" in u.netloc else None
    return addresses, path[0], int(path[1]) if len(path) == 2 else 0, user or None, password or None


def redis_client(url: str, **options: Any) -> aioredis.Redis:
    """A client for ``url`` (see the module); ``options`` go to each connection (e.g. ``decode_responses``)."""
    scheme = urlparse(url).scheme
    if scheme == CLUSTER_SCHEME:
        return cluster_client(url, **options)  # type: ignore[return-value]  # the same commands, routed by slot
    if scheme != SENTINEL_SCHEME:
        return aioredis.from_url(url, connection_class=connection_class(url), **options)
    addresses, service, db, user, password = sentinel_parts(url)
    sentinel = Sentinel(addresses, socket_timeout=2.0)
    return sentinel.master_for(service, connection_class=HiredisSentinelConnection, db=db, username=user,
                               password=password, **options)


def cluster_client(url: str, **options: Any) -> RedisCluster:
    """A Redis Cluster client with every address of a ``redis+cluster://`` URL as a seed."""
    parsed = urlparse(url)
    seeds = []
    for part in parsed.netloc.rsplit("@", 1)[-1].split(","):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit():
            raise RedisUrlError(f"{url!r}: each cluster node is host:port, got {part!r}")
        seeds.append(ClusterNode(host, int(port)))
    user = unquote(parsed.username) if parsed.username else None
    password = unquote(parsed.password) if parsed.password else None
    return RedisCluster(startup_nodes=seeds, username=user, password=password, **options)
