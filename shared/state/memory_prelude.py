"""What every ``MemoryState`` transition builds on (mirrors ``lua/prelude.lua``): the per-shard dictionaries
(``_Shard``) and ``MemoryPrelude``, the helpers that find a job's or node's shard and a GPU, save a GPU (its
occupancy bit, revision and compare-and-set version), move a job's state with its history, and re-queue it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shared.state import usage
from shared.state.job_routes import route_parts, route_shard
from shared.state.model import (
    ACTIVE_STATES,
    HISTORY_MAX,
    TERMINAL_STATES,
    HistoryEntry,
    JobRecord,
    StoredGpu,
    prio_score,
)
from shared.state.sharding import shard_of

_ACTIVE = ("placing", "running", "migrating")


class _Shard:
    def __init__(self) -> None:
        self.gpus: dict[str, StoredGpu] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.hist: dict[str, list[HistoryEntry]] = {}
        self.pending: dict[str, float] = {}
        self.cmds: dict[str, dict[str, Any]] = {}
        self.placing: dict[str, float] = {}
        self.done: dict[str, float] = {}
        """Ended jobs -> when they ended (``:done``): what ``expire`` deletes after the retention."""
        self.nodes: dict[str, dict[str, str]] = {}
        self.late: dict[str, set[int]] = {}
        """Per job, the attempts whose late run ``mark_running`` handled (the job hash's ``late`` in Redis)."""
        self.ra: dict[str, tuple[int, int]] = {}
        """Per job, (its attempts, the earlier attempt whose late run its placement took): the job hash's
        ``ra`` in Redis, valid while the job's attempts stay the first."""
        self.xid: dict[str, str] = {}
        """Per released job, the id of the exit report that released it (release.lua's ``xid``)."""
        self.occ = bytearray()
        self.holds: bytes | None = None
        """The balancer's reservations, encoded as in Redis (``model.encode_holds``)."""
        self.routes: dict[str, str] = {}
        """Jobs whose home is this shard that live in another: job -> ``"<shard>:<routed at>"`` (``:routes``)."""
        self.usage: dict[str, float] = {}
        """``usage.field(tenant, resource)`` -> the charges of the shard's active jobs (``:usage``)."""


class MemoryPrelude:
    """The shared helpers of ``MemoryState``'s transitions; ``MemoryState`` sets the attributes."""

    namespace: str
    shards: int
    _s: list[_Shard]

    def _js(self, job: str) -> _Shard:
        return self._s[self.job_shard(job)]

    def job_shard(self, job_id: str) -> int:
        """As ``RedisState.job_shard``: the shard the job was routed to, else its home."""
        home = shard_of(job_id, self.shards)
        raw = self._s[home].routes.get(job_id)
        return home if raw is None else route_shard(raw, self.shards, home)

    async def locate_jobs(self, job_ids: Iterable[str]) -> None:
        """Nothing to learn: every route is at hand (``RedisState.locate_jobs``)."""

    def _t_route(self, job: str, shard: int, now: float) -> int:
        """Mirrors ``lua/route.lua``."""
        home = self._s[shard_of(job, self.shards)]
        raw = home.routes.get(job)
        if raw is not None:
            return route_parts(raw)[0]
        if job in home.jobs:
            return -1
        home.routes[job] = f"{shard}:{now!r}"
        return shard

    def _ns(self, node: str) -> _Shard:
        return self._s[self.node_shard(node)]

    def node_shard(self, node: str) -> int:
        """As ``RedisState.node_shard``: the shard the node registered in (its block's), else its name's."""
        for s, sh in enumerate(self._s):
            if node in sh.nodes:
                return s
        return shard_of(node, self.shards)

    async def locate(self, nodes: Iterable[str]) -> None:
        """Nothing to learn: every node's shard is at hand (``RedisState.locate``)."""

    # --- helpers mirroring prelude.lua ----------------------------------------------------------------------
    def _save(self, sh: _Shard, g: StoredGpu, bump: bool | str = True) -> int:
        if bump:
            g.rev += 1
        if bump == "claim":
            g.ver += 1
        while len(sh.occ) <= g.pos:
            sh.occ.append(0)
        sh.occ[g.pos] = g.busy_mask
        return g.ver

    def _state(self, sh: _Shard, job: str, prev: str, to: str, reason: str, now: float) -> None:
        if prev in ACTIVE_STATES and to not in ACTIVE_STATES:  # as set_state: its charge is given back, once
            self._uncharge(sh, job)
        j = sh.jobs[job]
        j.state, j.reason, j.updated = to, reason, now
        self._hist(sh, job, prev, to, reason, now)
        if to == "placing":
            sh.placing[job] = now
        elif prev == "placing":
            sh.placing.pop(job, None)
        # as set_state in prelude.lua: a job in any other state must not stay listed to be deleted
        if to in TERMINAL_STATES:
            sh.done[job] = now
        else:
            sh.done.pop(job, None)

    @staticmethod
    def _charge(sh: _Shard, job: str, tenant: str, amounts: dict[str, float]) -> None:
        j = sh.jobs[job]
        j.tenant, j.usage, j.counted = tenant, dict(amounts), True
        _count(sh, tenant, amounts)

    @staticmethod
    def _uncharge(sh: _Shard, job: str) -> None:
        j = sh.jobs.get(job)
        if j is None or not j.counted:
            return
        j.counted = False
        for resource, amount in j.usage.items():
            k = usage.field(j.tenant, resource)
            left = sh.usage.get(k, 0.0) - amount
            if left <= 1e-9:
                sh.usage.pop(k, None)
            else:
                sh.usage[k] = left

    async def recount_usage(self, shard: int) -> int:
        """As ``lua/recount_usage.lua``."""
        sh = self._s[shard]
        sh.usage = {}
        n = 0
        for j in sh.jobs.values():
            j.counted = j.state in ACTIVE_STATES and bool(j.tenant)
            if j.counted:
                n += 1
                _count(sh, j.tenant, j.usage)
        return n

    def _hist(self, sh: _Shard, job: str, prev: str, to: str, reason: str, now: float) -> None:
        sh.hist.setdefault(job, []).append(HistoryEntry(at=now, to=to, reason=reason, prev=prev))
        del sh.hist[job][:-HISTORY_MAX]

    def _requeue(self, sh: _Shard, job: str, prev: str, reason: str, now: float) -> None:
        j = sh.jobs[job]
        j.attempts += 1
        j.gpu = j.inst = j.node = j.mig_gpu = j.mig_inst = ""
        j.slots = j.mig_gone = ()
        sh.pending[job] = prio_score(j.prio, j.at)
        self._state(sh, job, prev, "pending", reason, now)

    def _gpu(self, gpu_id: str) -> tuple[_Shard, StoredGpu | None]:
        sh = self._ns(gpu_id.rsplit("/", 1)[0])
        return sh, sh.gpus.get(gpu_id)


def _count(sh: _Shard, tenant: str, amounts: dict[str, float]) -> None:
    """Add a job's charge to the shard's usage counters."""
    for resource, amount in amounts.items():
        k = usage.field(tenant, resource)
        sh.usage[k] = sh.usage.get(k, 0.0) + amount
