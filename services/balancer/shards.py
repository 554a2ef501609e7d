"""The balancer's per-shard caches of Redis: one mirror of the GPUs, one set of holds and one backlog of large
waiting jobs per shard.

A mirror is only a cache: whatever it missed is read again from Redis (a whole reload, or the GPUs named), and
with tenancy the quota charges of the GPUs read are derived again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.balancer.backlog import Backlog
from services.balancer.holds import Holds
from services.balancer.mirror import Mirror
from services.balancer.tenancy import TenantLedger
from shared.events import JobSubmit
from shared.mig.geometry import Geometry
from shared.policy.placement.topology import domains
from shared.policy.reservation import ReservationParams
from shared.ports import StateStore
from shared.state import StoredGpu, shard_of
from shared.state.codec import decode_labels


class Shards:
    def __init__(self, count: int, geometry: Geometry, hold: ReservationParams, ledger: TenantLedger,
                 job_shard: Callable[[str], int] | None = None, routes_by_start: bool = True) -> None:
        self.count = count
        self._job_shard = job_shard or (lambda job_id: shard_of(job_id, count))
        """Where a job lives (``StateStore.job_shard``: its home, unless it was routed)."""
        self.geometry = geometry
        self.ledger = ledger
        self.mirrors = [Mirror(geometry) for _ in range(count)]
        self.holds = [Holds(hold) for _ in range(count)]
        self.backlogs = [Backlog(kept=routes_by_start and count > 1) for _ in range(count)]
        """Per shard, the large jobs waiting there: where a new large job would start soonest, read with several
        shards when ``routes_by_start`` (a policy that reserves)."""
        self.labels: dict[str, dict[str, str]] = {}
        """Node -> the topology labels it registered with (gangs within a block or rack)."""

    def of_job(self, job_id: str) -> int:
        return self._job_shard(job_id)

    def largest(self) -> int:
        """The most GPUs a gang could hold in any shard (``Kinds.gang_room``); 0 with one shard."""
        return max(m.kinds().gang_room for m in self.mirrors) if self.count > 1 else 0

    def within(self, shard: int, sub: JobSubmit) -> dict[str, Any]:
        """A gang's topology domains as ``JobRequest`` fields (the nodes of each block or rack of the shard);
        none for any other job."""
        if sub.topology is None or sub.demand.kind != "gpus":
            return {}
        nodes = {g.node for g in self.mirrors[shard].view().gpus}
        doms = domains(self.labels, sub.topology.level, nodes)
        return {"domains": tuple((d, tuple(sorted(ns))) for d, ns in sorted(doms.items())),
                "domain_level": sub.topology.level, "domain_required": sub.topology.mode == "required"}

    def knows(self, gpu_id: str) -> bool:
        return any(gpu_id in m.vers for m in self.mirrors)

    async def load(self, state: StateStore) -> None:
        """Every shard's mirror from Redis. Call under the balancer's lock."""
        await self.load_labels(state)
        by_shard: list[list[StoredGpu]] = [await state.load_gpus(shard) for shard in range(self.count)]
        for shard, found in enumerate(by_shard):
            mirror = self.mirrors[shard]
            if mirror.holds_exactly([g.id for g in found]):
                # the same GPUs: update the drifted ones in place (a fresh mirror would rebuild its placer's key
                # columns on the next decision, a pause every refresh)
                for g in found:
                    mirror.refresh(g)
                continue
            fresh = Mirror(self.geometry)
            for g in found:
                fresh.put(g)
            self.mirrors[shard] = fresh
        if self.ledger.active:
            self.ledger.rebuild(mm.snapshot() for mm in self.mirrors)

    async def load_labels(self, state: StateStore) -> None:
        self.labels = {n: decode_labels(h.get("labels", "")) for n, h in (await state.nodes()).items()}

    async def reload(self, state: StateStore, gpu_ids: set[str]) -> None:
        """The named GPUs from Redis. Call under the balancer's lock."""
        if not gpu_ids:
            return
        if any(g.rpartition("/")[0] not in self.labels for g in gpu_ids):  # a node registered since
            await self.load_labels(state)
        touched: dict[int, list[str]] = {}
        for g in await state.get_gpus(sorted(gpu_ids)):
            if g is not None:
                shard = state.node_shard(g.node)  # located by get_gpus: a node's block may name its shard
                self.mirrors[shard].put(g)
                touched.setdefault(shard, []).append(g.id)
        if self.ledger.active:
            for shard, ids in touched.items():
                self.ledger.reloaded(self.mirrors[shard].snapshot(), ids)
