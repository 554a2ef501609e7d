"""The state store in process memory, for unit tests only: the interface and the semantics of ``RedisState``
(each method here mirrors one Lua script in ``lua/``; keep the two in step), without a server.

Every transition runs synchronously inside one call, so it is atomic like a Lua script; ``batch()`` queues
calls and ``run()`` applies them in order, like the Redis pipeline.

``MemoryState`` is assembled from one module per concern: ``memory_prelude`` (shards and the helpers of
``prelude.lua``), ``memory_jobs`` (job transitions), ``memory_migrate`` (migration), ``memory_reserve``
(reservations), ``memory_slots`` (how a job leaves its slots), ``memory_nodes`` (node registration and loss),
``memory_reads`` (reads). This module holds the class itself, the batch, the instance transition and the
single-transition shortcuts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shared.state.codec import CancelResult
from shared.state.job_routes import lives_in, route_parts
from shared.state.memory_jobs import JobTransitions
from shared.state.memory_migrate import MigrationTransitions
from shared.state.memory_prelude import _Shard
from shared.state.memory_reads import MemoryReads
from shared.state.memory_reserve import reserve as _reserve
from shared.state.model import (
    PlacementFailure,
    ReleaseResult,
    Reservation,
    ReserveResult,
    StoredInstance,
)
from shared.state.sharding import block_shard, shard_of


class MemoryBatch:
    def __init__(self, store: MemoryState) -> None:
        self.store = store
        self._calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __len__(self) -> int:
        return len(self._calls)

    def _queue(self, name: str, args: tuple[Any, ...], kw: dict[str, Any]) -> int:
        self._calls.append((name, args, kw))
        return len(self._calls) - 1

    # the transitions of ``TransitionBatch``, each run by the store's ``_t_<name>`` when the batch runs
    def cancel(self, *args: Any, **kw: Any) -> int:
        return self._queue("cancel", args, kw)

    def enqueue(self, *args: Any, **kw: Any) -> int:
        return self._queue("enqueue", args, kw)

    def expire(self, *args: Any, **kw: Any) -> int:
        return self._queue("expire", args, kw)

    def fail_placement(self, *args: Any, **kw: Any) -> int:
        return self._queue("fail_placement", args, kw)

    def instance(self, *args: Any, **kw: Any) -> int:
        return self._queue("instance", args, kw)

    def mark_running(self, *args: Any, **kw: Any) -> int:
        return self._queue("mark_running", args, kw)

    def migrate_finish(self, *args: Any, **kw: Any) -> int:
        return self._queue("migrate_finish", args, kw)

    def migrate_reserve(self, *args: Any, **kw: Any) -> int:
        return self._queue("migrate_reserve", args, kw)

    def release(self, *args: Any, **kw: Any) -> int:
        return self._queue("release", args, kw)

    def reserve(self, *args: Any, **kw: Any) -> int:
        return self._queue("reserve", args, kw)

    def settle(self, *args: Any, **kw: Any) -> int:
        return self._queue("settle", args, kw)

    def track_command(self, *args: Any, **kw: Any) -> int:
        return self._queue("track_command", args, kw)

    def route(self, *args: Any, **kw: Any) -> int:
        return self._queue("route", args, kw)


    async def run(self) -> list[Any]:
        return [getattr(self.store, "_t_" + name)(*args, **kw) for name, args, kw in self._calls]


class MemoryState(JobTransitions, MigrationTransitions, MemoryReads):
    """``RedisState``'s interface over dictionaries."""

    def __init__(self, namespace: str = "", shards: int = 1) -> None:
        self.namespace = namespace
        self.shards = shards
        self._s = [_Shard() for _ in range(shards)]
        self._blocks: dict[str, int] = {}
        """Block label -> its shard (the block map in Redis)."""

    def batch(self) -> MemoryBatch:
        return MemoryBatch(self)

    async def load_scripts(self) -> None:
        """Nothing to load: the transitions are methods here."""

    async def claim_shards(self) -> None:
        """Nothing to agree with: a store in memory is its whole deployment."""

    async def close(self) -> None:
        pass

    async def wipe(self) -> int:
        self._s = [_Shard() for _ in range(self.shards)]
        self._blocks.clear()
        return 0

    # --- transitions (one per Lua script) -------------------------------------------------------------------
    def _t_reserve(self, r: Reservation, now: float) -> ReserveResult:
        return _reserve(self, r, now)

    def _t_instance(self, op: str, node: str, gpu_id: str, instance_id: str, now: float) -> str:
        sh, g = self._gpu(gpu_id)
        if g is None:
            return "nogpu"
        i = next((x for x in g.instances if x.id == instance_id), None)
        if i is None:
            return "gone"
        if op == "retire":
            if i.state != "idle":
                return "busy"
            i.state = "retiring"
            self._save(sh, g, "claim")
            return "ok"
        elif op == "drop":
            if i.state not in ("retiring", "idle") or i.job:
                return "busy"
            g.instances.remove(i)
        elif op == "restore":
            if i.state != "retiring" or i.job:
                return "noop"
            i.state = "idle"
        self._save(sh, g)
        return "ok"

    def _t_track_command(self, shard: int, cmd_id: str, info: dict[str, Any]) -> None:
        self._s[shard].cmds[cmd_id] = dict(info)

    # --- single-transition shortcuts, as RedisState ---------------------------------------------------------
    async def reserve(self, r: Reservation, now: float) -> ReserveResult:
        return self._t_reserve(r, now)

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
        return self._t_enqueue(job_id, spec, prio, submitted_at, reason, now, traceparent)

    async def release(
        self, job_id: str, kind: str, reason: str, now: float, instance_id: str = "", node: str = "",
        attempt: int | None = None, report: str = "",
    ) -> ReleaseResult:
        return self._t_release(job_id, kind, reason, now, instance_id, node, attempt, report)

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
        return self._t_mark_running(job_id, instance_id, now, cmd_id, attempt, node, found)

    async def fail_placement(
        self,
        job_id: str,
        reason: str,
        now: float,
        max_attempts: int = 3,
        cmd_id: str = "",
        attempt: int | None = None,
    ) -> PlacementFailure:
        return self._t_fail_placement(job_id, reason, now, max_attempts, cmd_id, attempt)

    async def cancel(self, job_id: str, reason: str, now: float) -> CancelResult:
        return self._t_cancel(job_id, reason, now)

    async def settle(self, job_id: str, to: str, reason: str, now: float, from_states: Iterable[str],
                     spec: bytes = b"") -> str:
        return self._t_settle(job_id, to, reason, now, tuple(from_states), spec)

    async def instance(self, op: str, node: str, gpu_id: str, instance_id: str, now: float) -> str:
        return self._t_instance(op, node, gpu_id, instance_id, now)

    async def expire(self, shard: int, before: float, limit: int, cap: int = 0, settled: float = 0.0) -> int:
        return self._t_expire(shard, before, limit, cap, settled)

    async def route(self, wanted: Mapping[str, int], now: float) -> dict[str, int]:
        if self.shards <= 1:
            return {j: 0 for j in wanted}
        return {j: lives_in(self._t_route(j, wanted[j], now), self.shards, shard_of(j, self.shards))
                for j in sorted(wanted)}

    async def prune_routes(self, before: float) -> int:
        n = 0
        for sh in self._s:
            for job, raw in list(sh.routes.items()):
                cell, at = route_parts(raw)
                if at < before and 0 <= cell < self.shards and job not in self._s[cell].jobs:
                    del sh.routes[job]
                    n += 1
        return n

    async def register_node(
        self, node: str, gpus: list[dict[str, Any]], now: float, reg_id: str = "", addr: str = "",
        labels: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        from shared.state.memory_nodes import register

        known = any(node in sh.nodes for sh in self._s)
        block = (labels or {}).get("block")
        new = self.block_shard(block) if block and self.shards > 1 else shard_of(node, self.shards)
        sh = self._ns(node) if known else self._s[new]
        return register(self, sh, node, gpus, now, reg_id, addr, dict(labels or {}))

    def block_shard(self, block: str) -> int:
        """As ``RedisState.block_shard``: chosen when the block's first node registers, then kept."""
        got = self._blocks.get(block)
        if got is None or got >= self.shards:
            counts = [0] * self.shards
            for s in self._blocks.values():
                if s < self.shards:
                    counts[s] += 1
            got = self._blocks[block] = block_shard(block, counts)
        return got

    async def node_lost(self, node: str, now: float, reason: str) -> dict[str, Any]:
        from shared.state.memory_nodes import lost

        return lost(self, self._ns(node), node, now, reason)

    async def node_stopped(self, node: str, job_id: str, now: float) -> dict[str, Any]:
        from shared.state.memory_nodes import stopped

        return stopped(self, self._ns(node), node, job_id)

    async def heartbeat(self, nodes: Iterable[tuple[str, float]]) -> None:
        for node, at in nodes:
            self._ns(node).nodes.setdefault(node, {})["last_seen"] = repr(at)
