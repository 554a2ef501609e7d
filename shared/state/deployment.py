"""The deployment's shard count, recorded in Redis so that every process of a namespace agrees on it.

A job lives in ``crc32(id) % shards`` and a node in its block's shard: a process started with another
``MIGSCHED_SHARDS`` than the rest would look for jobs and nodes in the wrong shards, record new ones where the
others never look, and lose them without an error. So the first scheduling service to start records its count
(``{ns:deployment}``, field ``shards``), every later one refuses to start with a different one, and the command
line reads the recorded count instead of assuming one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from shared.state.client import redis_client
from shared.state.codec import StateError, _s


class ShardCountMismatch(StateError):
    """A process's ``MIGSCHED_SHARDS`` differs from the count its namespace's deployment runs with."""

    def __init__(self, namespace: str, configured: int, recorded: int) -> None:
        self.configured = configured
        self.recorded = recorded
        super().__init__(
            f"MIGSCHED_SHARDS={configured}, but namespace {namespace or '(default)'!r} runs {recorded} shard(s): "
            f"every process of a deployment must use the same count (jobs and nodes are found by it); set "
            f"MIGSCHED_SHARDS={recorded}, or use another namespace, or an empty one, for {configured}")


def deployment_key(namespace: str) -> str:
    """A key of its own slot, outside every shard (like the block map)."""
    return f"{{{namespace or 'migsched'}:deployment}}"


async def recorded_shards(redis: Any, namespace: str) -> int | None:
    """The shard count the namespace's services run with, or None when none has started on this Redis."""
    raw = await redis.hget(deployment_key(namespace), "shards")
    if raw is None:
        return None
    try:
        return int(_s(raw))
    except ValueError:
        raise StateError(f"{deployment_key(namespace)} holds shards={_s(raw)!r}, not a count") from None


async def claim_shards(redis: Any, namespace: str, shards: int) -> None:
    """Record ``shards`` as the deployment's count if none is recorded yet, else check it is the same
    (``ShardCountMismatch``). HSETNX makes the first of several services starting at once the one that records."""
    key = deployment_key(namespace)
    await redis.hsetnx(key, "shards", str(shards))
    got = await recorded_shards(redis, namespace)
    if got is not None and got != shards:
        raise ShardCountMismatch(namespace, shards, got)


async def shards_to_use(redis: Any, namespace: str, configured: int | None, default: int = 1) -> int:
    """The count a client of the namespace reads with: the recorded one, or ``configured`` if it agrees
    (``ShardCountMismatch`` if not); ``default`` when nothing is recorded or asked for."""
    got = await recorded_shards(redis, namespace)
    if configured is None:
        return got or default
    if got is not None and got != configured:
        raise ShardCountMismatch(namespace, configured, got)
    return configured


S = TypeVar("S")


async def open_reader(store: Callable[..., S], settings: Any, shards: int | None = None, default: int = 1) -> S:
    """A store (``RedisState``, or a subclass such as the audit's read-only one) for a reader of the namespace:
    built with the count its services recorded (``shards_to_use``), so that it sees every shard; its connection
    closed again when that fails (``ShardCountMismatch``, Redis unreachable)."""
    client = redis_client(settings.redis_url, decode_responses=False)
    try:
        count = await shards_to_use(client, settings.namespace, shards, default)
    except BaseException:
        await client.aclose()
        raise
    return store(client, settings.namespace, count, settings.redis_wait_replicas, settings.redis_wait_timeout_s)
