"""``ClusterRoundTrips``: the store's round trips (``roundtrip.RoundTrips``) on a Redis Cluster.

Every key of a shard carries the shard's hash tag, so each transition touches one slot. A batch's commands are
grouped by the node that serves their slot, each group is one write and one read on that node's connection (the
groups concurrently), and the replies come back in the batch's order. A command without a key (``WAIT``) goes to
every node the batch touched, and its reply is the least of theirs: each node's replicas must hold what was
written there.

A ``MOVED`` or ``ASK`` reply (a failover promoted a replica, or slots moved), a ``CLUSTERDOWN``/``TRYAGAIN`` or a
lost connection refreshes the slot table and sends the whole batch again, as redis-py's cluster pipeline does:
the transitions are idempotent, so those that already ran are no-ops the second time. Past the retries the error
is raised as it is (an outage: ``shared.state.outage``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.errors import Unavailable

RETRIES = 5
_MOVED = (AskError, ClusterDownError, TryAgainError)  # AskError covers MovedError
_GONE = (RedisConnectionError, RedisTimeoutError, ConnectionError, TimeoutError, OSError)


class Redirected(ResponseError, Unavailable):
    """A batch met a node that no longer serves its slot, or a cluster that is failing over (an outage while it
    lasts)."""


def key_of(command: Sequence[Any]) -> str | bytes | None:
    """The key that routes ``command``: the first key of an ``EVALSHA``, the key of a one-key command, None for
    ``WAIT`` (which has none)."""
    name = str(command[0]).upper()
    if name == "WAIT":
        return None
    if name in ("EVALSHA", "EVAL"):
        return command[3] if int(command[2]) > 0 else None
    return command[1]


class ClusterRoundTrips:
    def __init__(self, cluster: RedisCluster) -> None:
        self.cluster = cluster
        self._stale = False
        """A batch failed on a node: the slot table is read again before the next one."""

    async def run(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """One write per node, one reply per command in order; an error reply is returned as its exception."""
        if not commands:
            return []
        await self.cluster.initialize()  # no-op once the slot table is known
        for attempt in range(RETRIES):
            try:
                if self._stale:
                    await self.cluster.nodes_manager.initialize()  # the slot table as the cluster has it now
                    self._stale = False
                return await self._once(commands)
            except (Redirected, *_GONE):
                self._stale = True
                if attempt == RETRIES - 1:
                    raise
                await asyncio.sleep(0.1 * 2**attempt)
        raise AssertionError("unreachable")

    def _groups(self, commands: Sequence[Sequence[Any]]) -> tuple[dict[ClusterNode, list[int]], list[int]]:
        groups: dict[ClusterNode, list[int]] = {}
        keyless: list[int] = []
        nodes = self.cluster.nodes_manager
        for i, cmd in enumerate(commands):
            key = key_of(cmd)
            if key is None:
                keyless.append(i)
                continue
            slot = key_slot(key.encode() if isinstance(key, str) else key)
            groups.setdefault(nodes.get_node_from_slot(slot), []).append(i)
        if keyless and not groups:
            groups[self.cluster.get_default_node()] = []
        return groups, keyless

    async def _once(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        groups, keyless = self._groups(commands)
        out: list[Any] = [None] * len(commands)
        answers = await asyncio.gather(*(self._node(node, [commands[i] for i in (*idx, *keyless)])
                                         for node, idx in groups.items()))
        per_node: dict[int, list[Any]] = {i: [] for i in keyless}
        for (_, idx), replies in zip(groups.items(), answers, strict=True):
            if any(isinstance(r, _MOVED) for r in replies):
                raise Redirected(str(next(r for r in replies if isinstance(r, _MOVED))))
            for i, r in zip(idx, replies, strict=False):
                out[i] = r
            for i, r in zip(keyless, replies[len(idx):], strict=True):
                per_node[i].append(r)
        for i, rs in per_node.items():  # WAIT: the least replicas any node reached (an error if any failed)
            failed = [r for r in rs if isinstance(r, Exception)]
            out[i] = failed[0] if failed else min(rs)
        return out

    @staticmethod
    async def _node(node: ClusterNode, commands: Sequence[Sequence[Any]]) -> list[Any]:
        conn = node.acquire_connection()
        try:
            await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(await conn.read_response())
                except ResponseError as exc:  # the whole reply: the connection stays in step
                    replies.append(exc)
            return replies
        except BaseException:
            await conn.disconnect()  # its unread replies must not answer the next batch
            raise
        finally:
            node.release(conn)

    async def close(self) -> None:
        """Nothing of its own to give back: the connections are the cluster client's."""
