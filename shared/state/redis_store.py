"""The cluster-state store on Redis: every transition one Lua script (loaded once, called by EVALSHA), with a
compare-and-set on the GPU's version where a decision was made on a possibly stale view.

    state = RedisState.from_settings(settings)
    b = state.batch()                      # many transitions, one round trip
    i = b.reserve(reservation, now)
    j = b.enqueue(job_id, spec, prio, submitted_at, "no room", now)
    res = await b.run(); res[i].ok

Single transitions have a shortcut each (``await state.release(...)``). Reads: ``load_gpus``, ``get_gpus``,
``snapshot``, ``occupancy``, ``job``, ``history``, ``pending``, ``nodes``, ``commands``, ``ended_before``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from shared.state import usage
from shared.state.batch import Batch
from shared.state.client import redis_client
from shared.state.cluster_roundtrip import ClusterRoundTrips
from shared.state.codec import (  # noqa: F401  (re-exported: callers import them from here)
    _ENC,
    _HIST,
    SCRIPTS,
    CancelResult,
    StateError,
    _s,
    block_script_source,
    decode_charge,
    decode_dump,
    decode_gpu,
    decode_instances,
    decode_job,
    decode_slots,
    history_raw,
    script_source,
)
from shared.state.deployment import claim_shards, deployment_key
from shared.state.job_routes import JobRoutes
from shared.state.keys import Keys
from shared.state.model import (
    HistoryEntry,
    Hold,
    JobRecord,
    PlacementFailure,
    ReleaseResult,
    Reservation,
    ReserveResult,
    StoredGpu,
    StoredInstance,
    decode_holds,
    encode_holds,
)
from shared.state.reads import DerivedReads
from shared.state.roundtrip import RoundTrips
from shared.state.sharding import block_order, shard_of


class RedisState(DerivedReads):
    """The store for one namespace. ``shards`` must be the same in every process of a deployment."""

    def __init__(self, redis: aioredis.Redis, namespace: str = "", shards: int = 1, wait_replicas: int = 0,
                 wait_timeout_s: float = 1.0) -> None:
        self.redis = redis
        self.wait_replicas = wait_replicas
        """Replicas every round trip of transitions must reach before its results are used (``Batch``)."""
        self.wait_timeout_ms = max(1, round(wait_timeout_s * 1000))
        self.namespace = namespace
        self.shards = shards
        self._keys = [Keys(namespace, s) for s in range(shards)]
        self._node_shard: dict[str, int] = {}
        """Node -> shard, as learnt (``locate``, ``nodes``, registrations): a node keeps its first shard."""
        self.routes = JobRoutes(redis, self._keys)
        """Where jobs live: routes read and written, and what this process has learnt of them."""
        self._scripts: dict[str, Any] = {}
        self.blocks_key = f"{{{namespace or 'migsched'}:blocks}}"
        """Block label -> its shard (``block_shard``): a key of its own slot, read only at registrations."""
        self.block_script = redis.register_script(block_script_source())
        self.roundtrips: RoundTrips | ClusterRoundTrips = (
            ClusterRoundTrips(redis) if isinstance(redis, RedisCluster) else RoundTrips(redis))

    @classmethod
    def from_settings(cls, settings: Any) -> RedisState:
        client = redis_client(settings.redis_url, decode_responses=False)
        return cls(client, settings.namespace, settings.shards, settings.redis_wait_replicas,
                   settings.redis_wait_timeout_s)

    async def close(self) -> None:
        await self.roundtrips.close()
        await self.redis.aclose()

    async def claim_shards(self) -> None:
        """Record this process's shard count as the namespace's, or refuse one that differs
        (``shared.state.deployment``)."""
        await claim_shards(self.redis, self.namespace, self.shards)

    def sha(self, name: str) -> str:
        return str(self.script(name).sha)

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every transition (at start-up, and again after Redis forgot them)."""
        for name in SCRIPTS:
            await self.redis.script_load(script_source(name))
        await self.redis.script_load(block_script_source())

    def script(self, name: str) -> Any:
        s = self._scripts.get(name)
        if s is None:
            s = self._scripts[name] = self.redis.register_script(script_source(name))
        return s

    def keys(self, shard: int) -> Keys:
        return self._keys[shard]

    def job_keys(self, job_id: str) -> Keys:
        return self._keys[self.job_shard(job_id)]

    def job_shard(self, job_id: str) -> int:
        """The job's shard as this process knows it (``locate_jobs``, ``route``): the one it was routed to,
        else its home (crc32 of its id)."""
        return self.routes.learnt.shard(job_id)

    def learn_job(self, job_id: str, shard: int) -> None:
        self.routes.learnt.learn(job_id, shard)

    async def locate_jobs(self, job_ids: Iterable[str]) -> None:
        """Learn where each job not known here lives, before a read (transitions find out by themselves)."""
        await self.routes.locate(job_ids)

    async def route(self, wanted: Mapping[str, int], now: float) -> dict[str, int]:
        return await self.routes.route(self.batch(), wanted, now)

    async def prune_routes(self, before: float) -> int:
        return await self.routes.prune(before)

    def node_keys(self, node: str) -> Keys:
        return self._keys[self.node_shard(node)]

    def node_shard(self, node: str) -> int:
        """The node's shard as this process knows it (``locate``): its block's when it registered with one,
        else its name's."""
        got = self._node_shard.get(node)
        return shard_of(node, self.shards) if got is None else got

    async def locate(self, nodes: Iterable[str]) -> None:
        """Learn the shard of every node not known here yet (one read of each shard's node set): a node whose
        ``block`` label chose its shard cannot be told by its name. Unregistered nodes stay unknown."""
        missing = sorted({n for n in nodes if n not in self._node_shard})
        if self.shards <= 1 or not missing:
            return
        pipe = self.redis.pipeline(transaction=False)
        for s in range(self.shards):
            pipe.smismember(self.keys(s).nodes, missing)
        for s, hits in enumerate(await pipe.execute()):
            for n, hit in zip(missing, hits, strict=True):
                if hit:
                    self._node_shard.setdefault(n, s)

    def batch(self) -> Batch:
        return Batch(self)

    async def _one(self, add: Any, *args: Any) -> Any:
        b = self.batch()
        getattr(b, add)(*args)
        return (await b.run())[0]

    # --- single-transition shortcuts ------------------------------------------------------------------------
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

    # --- reads ----------------------------------------------------------------------------------------------
    async def gpu_ids(self, shard: int | None = None) -> list[str]:
        shards = range(self.shards) if shard is None else (shard,)
        pipe = self.redis.pipeline(transaction=False)
        for s in shards:
            pipe.zrange(self.keys(s).gpus, 0, -1)
        return [_s(x) for ids in await pipe.execute() for x in ids]

    async def get_gpus(self, gpu_ids: Sequence[str]) -> list[StoredGpu | None]:
        """GPUs by id, one round trip. A GPU id ``node/index`` names its shard through the node."""
        await self.locate(g.rsplit("/", 1)[0] for g in gpu_ids)
        pipe = self.redis.pipeline(transaction=False)
        for g in gpu_ids:
            pipe.hgetall(self.node_keys(g.rsplit("/", 1)[0]).gpu(g))
        return [decode_gpu(g, h) for g, h in zip(gpu_ids, await pipe.execute(), strict=True)]

    async def put_holds(self, shard: int, holds: Sequence[Hold], now: float) -> None:
        """The reservations the balancer's last backfill pass planned for the shard (read by ``holds``)."""
        await self.redis.set(self.keys(shard).holds, encode_holds(holds, now))

    async def holds(self, shard: int = 0) -> tuple[float, list[Hold]]:
        """(when they were planned, the reservations) as last put; (0, []) when none ever was."""
        return decode_holds(await self.redis.get(self.keys(shard).holds))

    async def tenant_usage(self, shard: int = 0) -> dict[str, dict[str, float]]:
        """What the shard's active jobs are charged, per tenant and resource (``{ns:s}:usage``)."""
        return usage.decode(await self.redis.hgetall(self.keys(shard).usage))

    async def recount_usage(self, shard: int) -> int:
        """Rebuild the shard's usage counters from its active jobs' stored charges, in one step (a repair;
        ``lua/recount_usage.lua``) -> how many jobs are counted."""
        return int(await self.script("recount_usage")([self.keys(shard).gpus], []))

    async def occupancy(self, shard: int = 0) -> bytes:
        """The shard's compact occupancy array: byte i = busy mask of the GPU at position i."""
        raw = await self.redis.get(self.keys(shard).occ)
        return raw if isinstance(raw, bytes) else b""

    async def job(self, job_id: str) -> JobRecord | None:
        await self.locate_jobs([job_id])
        raw: dict[bytes, bytes] = await self.redis.hgetall(self.job_keys(job_id).job(job_id))  # type: ignore[assignment]
        return decode_job(job_id, raw)

    async def jobs(self, job_ids: Sequence[str]) -> list[JobRecord | None]:
        await self.locate_jobs(job_ids)
        pipe = self.redis.pipeline(transaction=False)
        for j in job_ids:
            pipe.hgetall(self.job_keys(j).job(j))
        return [decode_job(j, h) for j, h in zip(job_ids, await pipe.execute(), strict=True)]

    async def history(self, job_id: str) -> list[HistoryEntry]:
        await self.locate_jobs([job_id])
        k = self.job_keys(job_id)
        # one instant (MULTI/EXEC): an entry is never seen twice or missed. redis-py's cluster transactions keep
        # state across event loops and fail in the next one; there the two reads go as a plain pipeline (the
        # list is only an older version's history, which nothing appends to any more)
        pipe = self.redis.pipeline(transaction=not isinstance(self.redis, RedisCluster))
        pipe.hgetall(k.job(job_id))
        pipe.lrange(k.hist(job_id), 0, -1)
        job, legacy = await pipe.execute()
        return [_HIST.decode(x) for x in history_raw(job, legacy)]

    async def pending(self, shard: int = 0, limit: int = 256) -> list[JobRecord]:
        """The first ``limit`` pending jobs in queue order (priority, then age)."""
        return [j for j in await self.jobs(await self.pending_ids(shard, limit)) if j is not None]

    async def pending_count(self, shard: int | None = None) -> int:
        shards = range(self.shards) if shard is None else (shard,)
        return sum([int(await self.redis.zcard(self.keys(s).pending)) for s in shards])

    async def pending_ids(self, shard: int = 0, limit: int = -1) -> list[str]:
        """Queued job ids in queue order (all when ``limit`` is -1)."""
        end = -1 if limit < 0 else limit - 1
        ids = [_s(x) for x in await self.redis.zrange(self.keys(shard).pending, 0, end)]
        for j in ids:  # queued here, so they live here
            self.routes.learnt.learn(j, shard)
        return ids

    async def all_job_ids(self, shard: int) -> list[str]:
        return sorted(_s(x) for x in await self.redis.smembers(self.keys(shard).jobs))

    async def nodes(self, shard: int | None = None) -> dict[str, dict[str, str]]:
        shards = range(self.shards) if shard is None else (shard,)
        out: dict[str, dict[str, str]] = {}
        for s in shards:
            names = sorted(_s(n) for n in await self.redis.smembers(self.keys(s).nodes))
            pipe = self.redis.pipeline(transaction=False)
            for n in names:
                pipe.hgetall(self.keys(s).node(n))
            for n, h in zip(names, await pipe.execute(), strict=True):
                out[n] = {_s(k): _s(v) for k, v in h.items()}
                self._node_shard.setdefault(n, s)
        return out

    async def commands(self, shard: int = 0) -> dict[str, dict[str, Any]]:
        raw = await self.redis.hgetall(self.keys(shard).cmds)
        return {_s(k): msgspec.json.decode(v) for k, v in raw.items()}

    async def ended_before(self, shard: int, before: float) -> list[str]:
        """Jobs that reached a terminal state before ``before`` and are still kept, the oldest first."""
        return [_s(x) for x in await self.redis.zrangebyscore(self.keys(shard).done, "-inf", f"({before!r}")]

    async def placing_since(self, shard: int, before: float) -> list[str]:
        """Jobs that entered placing before ``before`` and are still there."""
        return [_s(x) for x in await self.redis.zrangebyscore(self.keys(shard).placing, "-inf", before)]

    async def forget_command(self, shard: int, cmd_id: str) -> None:
        await self.redis.hdel(self.keys(shard).cmds, cmd_id)

    async def dump(
        self, shard: int
    ) -> tuple[list[StoredGpu], list[JobRecord], set[str], bytes, set[str], dict[str, dict[str, float]]]:
        """One consistent read of a shard (one Lua script): GPUs, jobs (state, placement and charge only), the
        queue, the occupancy array, the ended jobs (``:done``), the tenants' usage counters. For the audit of a
        live system, where separate reads would race the services."""
        return decode_dump(await self.script("dump")([self.keys(shard).gpus], []))

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
