"""The balancer: decode submits, decide on the local mirror (``shared.policy.balancer.place``), commit every
reservation of the batch as one Redis pipeline of compare-and-set Lua calls, re-decide the losers, send each
placement's executor command (``cmd.<node>``, tracked in ``:cmds``), ack. No room: the job waits in the
shard's priority queue with the policy's reasons, and is tried again (backfill) when room appears: a job exit,
a capacity change, or the periodic pass.

Consumers: ``jobs.submit`` (balancer-submit), ``jobs.cancel`` (balancer-cancel), ``jobs.exit`` (balancer-exit),
``sched.capacity`` (balancer-capacity). All decisions and commits run under one lock, so the mirror is only
changed by one batch at a time; Redis serialises against the other services and replicas.

This module holds the ``Balancer`` service: its consumers, periodic tasks and mirror refreshes. The decision
and commit of a batch are in ``decide`` (``Decisions``, ``Candidate``), the backfill in ``backfill``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from services.balancer.backfill import Backfill
from services.balancer.candidate import Candidate
from services.balancer.decide import mig_gang_refused, placed_on
from services.balancer.holds import Holds
from services.balancer.mirror import Mirror
from services.balancer.tenancy import TenantLedger
from services.common import metrics as m
from shared.bus import Consumer, Delivery
from shared.events import JobSubmit
from shared.policy.balancer import BalancerParams
from shared.policy.fragcost import UNIFORM_SHAPES, frag_rate
from shared.policy.registry import PlacementPolicy, describe, get_policy
from shared.policy.reservation import ReservationParams
from shared.policy.snapshot_columns import SERVICE_DROP_ROWS, size_drop_rows
from shared.settings import BalancerSettings
from shared.state import StoredGpu, shard_of

__all__ = ["Balancer", "Candidate", "mig_gang_refused", "placed_on"]


def placement_policy(st: BalancerSettings) -> tuple[BalancerParams, PlacementPolicy | None]:
    """The balancer's parameters (its rule with tenancy, and ``paper``'s own) and the named policy from the
    registry, or None for the ``paper`` family, which the mirror answers incrementally with those parameters."""
    params = BalancerParams(threshold=st.threshold, dynamic=st.dynamic, top_k=max(1, st.top_k))
    spec = describe(st.policy)
    if spec.takes_threshold and spec.repartitions:
        _, fn = get_policy(st.policy, threshold=st.threshold, top_k=max(1, st.top_k))
        bp = getattr(fn, "balancer_params", None)
        if isinstance(bp, BalancerParams):
            return msgspec.structs.replace(bp, dynamic=st.dynamic), None
    kw: dict[str, Any] = {"top_k": max(1, st.top_k)} if st.policy == "migsched" else {}
    return params, get_policy(st.policy, **kw)[1]


class Balancer(Backfill):
    name = "balancer"
    settings: BalancerSettings

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        st = self.settings
        self.params, self.policy = placement_policy(st)
        self.reserves = describe(st.policy).reserves
        hold = ReservationParams(after_s=st.reserve_after_s, max_held=st.max_reservations)
        self.holds = [Holds(hold) for _ in range(st.shards)]
        self.mirrors = [Mirror(self.geometry) for _ in range(st.shards)]
        size_drop_rows(SERVICE_DROP_ROWS)  # the mirror's rows: bounded, or RSS grows with every new GPU state
        self.lock = asyncio.Lock()
        self._backfill_wanted = asyncio.Event()
        self._queue_maybe_nonempty = True
        self._refresh_wanted = False
        self.placed = 0
        # tenancy (quotas, priority classes, preemption); inactive without MIGSCHED_TENANCY_FILE
        self.ledger = TenantLedger(st.tenancy_file, st.reserve_full, st.tenancy_poll_s, self.geometry)
        # decoded specs of the jobs this replica queued, so a backfill pass reads only the queue's ids
        self._waiting: dict[str, tuple[JobSubmit, bytes, Any]] = {}
        # metric children resolved once: labels() per decision costs as much as a small decision
        self._m_decide = m.child(m.DECISION_SECONDS, self.name)
        self._m_outcome = {
            o: m.child(m.DECISIONS, self.name, o) for o in ("placed", "pending", "duplicate", "conflict", "rejected")
        }

    def consumers(self) -> list[Consumer]:
        s, b = self.subjects, self.bus
        return [
            # two batches in flight: one is decided while the other's placements are being published
            b.consumer(s.stream_jobs, "balancer-submit", s.jobs_submit, self.on_submit, concurrency=2),
            b.consumer(s.stream_jobs, "balancer-cancel", s.jobs_cancel, self.on_cancel),
            # every replica keeps its own mirror, so every replica must hear of every exit and capacity change;
            # the mirror is a cache of Redis, so these go unacknowledged: one message less per job, and an
            # update the handler could not apply (it is not redelivered) reloads the mirror instead
            b.consumer(s.stream_jobs, "balancer-exit", s.jobs_exit, self.on_exit, ephemeral=True, acks=False,
                       lost=self._mirror_lost),
            b.consumer(s.stream_sched, "balancer-capacity", s.sched_capacity, self.on_capacity, ephemeral=True,
                       acks=False, lost=self._mirror_lost),
        ]

    def periodic(self) -> list[tuple[str, float, Any]]:
        st = self.settings
        return [
            ("mirror-refresh", st.mirror_refresh_s, self.refresh),
            ("backfill", 0.02, self._backfill_tick),
            ("backfill-sweep", 1.0, self.request_backfill),
            ("refresh-on-demand", 0.2, self._refresh_if_wanted),
            *([("tenancy-reload", st.tenancy_poll_s, self._poll_tenancy)] if self.ledger.active else []),
        ]

    async def _poll_tenancy(self) -> None:
        async with self.lock:
            r = self.ledger.poll()
        if r is not None and r.ok:
            self.request_backfill_now(queue_grew=True)  # a raised quota may let held jobs start

    async def prepare(self) -> None:
        await self.refresh()

    async def refresh(self) -> None:
        """Reload every shard's mirror from Redis (and publish the queue depth)."""
        gpus = await self.state.load_gpus()
        by_shard: list[list[StoredGpu]] = [[] for _ in range(self.settings.shards)]
        for g in gpus:
            by_shard[shard_of(g.node, self.settings.shards)].append(g)
        async with self.lock:
            for shard, found in enumerate(by_shard):
                mirror = self.mirrors[shard]
                if mirror.holds_exactly([g.id for g in found]):
                    # the same GPUs: update the drifted ones in place (a fresh mirror would rebuild its
                    # placer's key columns on the next decision, a pause every refresh)
                    for g in found:
                        mirror.refresh(g)
                    continue
                fresh = Mirror(self.geometry)
                for g in found:
                    fresh.put(g)
                self.mirrors[shard] = fresh
            if self.ledger.active:
                self.ledger.rebuild(mm.snapshot() for mm in self.mirrors)
        m.child(m.QUEUE_DEPTH, self.name).set(await self.state.pending_count())
        if len(self.mirrors) == 1 and len(self.mirrors[0]):
            m.child(m.FRAG_RATE, self.name).set(frag_rate(self.mirrors[0].snapshot(), UNIFORM_SHAPES))
        self.request_backfill_now(queue_grew=True)

    def _mirror_lost(self, reason: str) -> None:
        """An exit or capacity change the mirror missed: reload it whole (coalesced, within 0.2 s)."""
        self._refresh_wanted = True

    async def _refresh_if_wanted(self) -> None:
        if self._refresh_wanted:
            self._refresh_wanted = False
            await self.refresh()

    async def _reload(self, gpu_ids: set[str]) -> None:
        if not gpu_ids:
            return
        touched: dict[int, list[str]] = {}
        for g in await self.state.get_gpus(sorted(gpu_ids)):
            if g is not None:
                shard = shard_of(g.node, self.settings.shards)
                self.mirrors[shard].put(g)
                touched.setdefault(shard, []).append(g.id)
        if self.ledger.active:
            for shard, ids in touched.items():
                self.ledger.reloaded(self.mirrors[shard].snapshot(), ids)

    # --- jobs.submit ----------------------------------------------------------------------------------------
    async def on_submit(self, ds: list[Delivery]) -> None:
        t0 = time.perf_counter()
        cands = [Candidate(submit=d.data, spec=d.msg.data, ctx=d.ctx, delivery=d) for d in ds]
        async with self.lock:
            out = await self.decide_and_commit(cands)
        # published outside the lock: the reservations are committed, and the next batch can be decided
        # meanwhile
        await self.send(out)
        m.child(m.BATCH_SECONDS, self.name, "submit").observe(time.perf_counter() - t0)
        m.child(m.BATCH_SIZE, self.name, "submit").observe(len(ds))

    # --- jobs.exit, sched.capacity, jobs.cancel -------------------------------------------------------------
    async def on_exit(self, ds: list[Delivery]) -> None:
        """Apply each exit to the mirror. The release transition itself is already committed: the node
        registry publishes ``jobs.exit`` only after it (so a second release here would always be a no-op), and
        a release never moves the compare-and-set version, so the mirror stays exact without reading Redis."""
        stale: set[str] = set()
        for d in ds:
            e = d.data
            mirror = self.mirrors[shard_of(e.node, self.settings.shards)]
            slots = [(s.gpu_id, s.instance_id) for s in e.slots] or [(e.gpu_id, e.instance_id)]
            missed = [g for g, i in slots if not mirror.release(g, i, e.job_id)]
            if len(missed) < len(slots):
                self.ledger.uncharge(e.job_id)
            stale.update(missed)  # the reload re-derives the quota charges of those GPUs' jobs
        if stale:  # the mirror had not seen that placement yet: read those GPUs
            async with self.lock:
                await self._reload(stale)
        self.request_backfill_now()

    async def on_capacity(self, ds: list[Delivery]) -> None:
        ids: set[str] = set()
        full = False
        for d in ds:
            ids.update(d.data.gpu_ids)
            full = full or not d.data.gpu_ids
        if full:
            self._refresh_wanted = True
            return
        async with self.lock:
            known = {g for g in ids if any(g in mm.vers for mm in self.mirrors)}
            await self._reload(known)
        if ids - known:  # a new GPU (registration): a full reload, coalesced (64 nodes register at once)
            self._refresh_wanted = True
        self.request_backfill_now(queue_grew=True)  # capacity signals also follow re-queues by other services

    async def on_cancel(self, ds: list[Delivery]) -> None:
        now = time.time()
        b = self.state.batch()
        for d in ds:
            b.cancel(d.data.job_id, d.data.reason or "cancelled by request", now)
            self._waiting.pop(d.data.job_id, None)
        for d, res in zip(ds, await b.run(), strict=True):
            d.span.set_attribute("migsched.cancel", res.status)
