"""The cluster-state store on Redis: every transition one Lua script (loaded once, called by EVALSHA), with a
compare-and-set on the GPU's version where a decision was made on a possibly stale view.

    state = RedisState.from_settings(settings)
    b = state.batch()                      # many transitions, one round trip
    i = b.reserve(reservation, now)
    j = b.enqueue(job_id, spec, prio, submitted_at, "no room", now)
    res = await b.run(); res[i].ok

Single transitions have a shortcut each (``await state.release(...)``). Reads (``redis_reads``): ``load_gpus``,
``get_gpus``, ``snapshot``, ``occupancy``, ``job``, ``history``, ``pending``, ``nodes``, ``commands``,
``ended_before``. Where keys live (``redis_shards``): the connection, the scripts, the shard of a job or a node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from shared.state.client import redis_client
from shared.state.codec import (
    _ENC,
    CancelResult,
)
from shared.state.deployment import deployment_key
from shared.state.model import (
    Hold,
    PlacementFailure,
    ReleaseResult,
    Reservation,
    ReserveResult,
    StoredInstance,
    encode_holds,
)
from shared.state.redis_reads import RedisReads
from shared.state.sharding import block_order, shard_of


class RedisState(RedisReads):
    """The store for one namespace: every transition one Lua script; the reads are ``RedisReads``'s."""

    @classmethod
    def from_settings(cls, settings: Any) -> RedisState:
        client = redis_client(settings.redis_url, decode_responses=False)
        return cls(client, settings.namespace, settings.shards, settings.redis_wait_replicas,
                   settings.redis_wait_timeout_s)

    async def reserve(self, r: Reservation, now: float) -> ReserveResult:
        return await self._one("reserve", r, now)

    async def enqueue(
        self,
        job_id: str,
        spec: bytes,
        prio: int,
        submitted_at: float,
        reason: str,
        now: float,
        traceparent: str = "",
    ) -> str:
        return await self._one("enqueue", job_id, spec, prio, submitted_at, reason, now, traceparent)

    async def release(
        self, job_id: str, kind: str, reason: str, now: float, instance_id: str = "", node: str = "",
        attempt: int | None = None, report: str = "",
    ) -> ReleaseResult:
        return await self._one("release", job_id, kind, reason, now, instance_id, node, attempt, report)

    async def mark_running(
        self,
        job_id: str,
        instance_id: str,
        now: float,
        cmd_id: str = "",
        attempt: int | None = None,
        node: str = "",
        found: StoredInstance | None = None,
    ) -> str:
        return await self._one("mark_running", job_id, instance_id, now, cmd_id, attempt, node, found)

    async def fail_placement(
        self,
        job_id: str,
        reason: str,
        now: float,
        max_attempts: int = 3,
        cmd_id: str = "",
        attempt: int | None = None,
    ) -> PlacementFailure:
        return await self._one("fail_placement", job_id, reason, now, max_attempts, cmd_id, attempt)

    async def cancel(self, job_id: str, reason: str, now: float) -> CancelResult:
        return await self._one("cancel", job_id, reason, now)

    async def settle(self, job_id: str, to: str, reason: str, now: float, from_states: Iterable[str],
                     spec: bytes = b"") -> str:
        return await self._one("settle", job_id, to, reason, now, tuple(from_states), spec)

    async def instance(self, op: str, node: str, gpu_id: str, instance_id: str, now: float) -> str:
        return await self._one("instance", op, node, gpu_id, instance_id, now)

    async def expire(self, shard: int, before: float, limit: int, cap: int = 0, settled: float = 0.0) -> int:
        return await self._one("expire", shard, before, limit, cap, settled)

    async def register_node(
        self, node: str, gpus: list[dict[str, Any]], now: float, reg_id: str = "", addr: str = "",
        labels: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """gpus: [{id, index, model, mig, healthy, uuid, instances: [StoredInstance-like dicts, with ``job``
        when the node runs one there]}] -> {requeued: [job ids], drift: [text], gpus: [ids], stops: [[job, gpu
        id, instance id]: jobs running where the state does not hold them, to be stopped]}, plus ``replay:
        True`` (and nothing changed) when ``reg_id`` is the node's last applied registration. ``addr``: the address
        the node's executor declares (a gang's rendezvous host when its first member is there); ``labels``: its
        topology labels (a new node's shard is its ``block``'s, ``block_shard``, else its name's)."""
        await self.locate([node])
        if node not in self._node_shard:
            block = (labels or {}).get("block")
            self._node_shard[node] = (await self.block_shard(block) if block and self.shards > 1
                                      else shard_of(node, self.shards))
        k = self.node_keys(node)
        raw = await self.script("node")(
            [k.gpus, k.node(node)],
            ["register", node, repr(now), _ENC.encode(gpus), reg_id, addr, _ENC.encode(labels or {})],
        )
        return _lists(msgspec.json.decode(raw))

    async def block_shard(self, block: str) -> int:
        """The shard of ``block``'s nodes: chosen when its first node registers (``model.block_shard``, atomic
        in ``lua/block_shard.lua`` so that registries racing on a new block agree), then kept."""
        order = ",".join(map(str, block_order(block, self.shards)))
        return int(await self.block_script(keys=[self.blocks_key], args=[block, self.shards, order]))

    async def node_lost(self, node: str, now: float, reason: str) -> dict[str, Any]:
        await self.locate([node])
        k = self.node_keys(node)
        raw = await self.script("node")([k.gpus, k.node(node)], ["lost", node, repr(now), reason])
        return _lists(msgspec.json.decode(raw))

    async def node_stopped(self, node: str, job_id: str, now: float) -> dict[str, Any]:
        """The node no longer runs ``job_id``: instances a registration kept ``retiring`` for it (it ran there
        unbeknown to the state) become idle -> {gpus: [ids changed]}."""
        await self.locate([node])
        k = self.node_keys(node)
        raw = await self.script("node")([k.gpus, k.node(node)], ["stopped", node, repr(now), job_id])
        return _lists(msgspec.json.decode(raw))

    async def heartbeat(self, nodes: Iterable[tuple[str, float]]) -> None:
        """Record last-seen times (not a GPU transition: a plain pipelined HSET) of registered nodes."""
        nodes = list(nodes)
        await self.locate(n for n, _ in nodes)
        pipe = self.redis.pipeline(transaction=False)
        for node, at in nodes:
            if self.shards > 1 and node not in self._node_shard:
                continue  # not registered: writing under its name's shard would make a node record there
            pipe.hset(self.node_keys(node).node(node), "last_seen", repr(at))
        await pipe.execute()

    async def put_holds(self, shard: int, holds: Sequence[Hold], now: float) -> None:
        """The reservations the balancer's last backfill pass planned for the shard (read by ``holds``)."""
        await self.redis.set(self.keys(shard).holds, encode_holds(holds, now))

    async def recount_usage(self, shard: int) -> int:
        """Rebuild the shard's usage counters from its active jobs' stored charges, in one step (a repair;
        ``lua/recount_usage.lua``) -> how many jobs are counted."""
        return int(await self.script("recount_usage")([self.keys(shard).gpus], []))

    async def forget_command(self, shard: int, cmd_id: str) -> None:
        await self.redis.hdel(self.keys(shard).cmds, cmd_id)

    async def wipe(self) -> int:
        """Delete every key of this namespace (tests, ``migsched up --fresh``)."""
        n = 0
        for k in self._keys:
            async for key in self.redis.scan_iter(
                match=k.tag.replace("{", "\\{").replace("}", "\\}") + ":*", count=1000
            ):
                n += int(await self.redis.delete(key))
        return n + int(await self.redis.delete(self.blocks_key, deployment_key(self.namespace)))


def _lists(d: dict[str, Any]) -> dict[str, Any]:
    # cjson writes an empty Lua table as {}: make the lists lists again
    return {k: ([] if isinstance(v, dict) else v) for k, v in d.items()}
