"""The balancer: decode submits, decide on the local mirror (``shared.policy.placement.balancer.place``), commit every
reservation of the batch as one Redis pipeline of compare-and-set Lua calls, re-decide the losers, send each
placement's executor command (``cmd.<node>``, tracked in ``:cmds``), ack. No room: the job waits in the
shard's priority queue with the policy's reasons, and is tried again (backfill) when room appears: a job exit,
a capacity change, or the periodic pass.

Consumers: ``jobs.submit`` (balancer-submit), ``jobs.cancel`` (balancer-cancel), ``jobs.exit`` (balancer-exit),
``sched.capacity`` (balancer-capacity); submits that ``balancer-submit`` skipped when its leader changed are read
back from the stream (``MissedSubmits``). All decisions and commits run under one lock, so the mirror is only
changed by one batch at a time; Redis serialises against the other services and replicas.

The service is a composition of named parts, each in its module: ``Candidate`` (a decoded job), ``Shards``
(the mirrors and holds), ``Decider`` (one job's decision), ``Pipeline`` (a batch: decide, commit, settle, retry
the losers), ``Dispatcher`` (the commands) and ``Backfill`` (the queue). This module wires them to the consumers
and periodic tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import msgspec

from services.balancer import metrics as m
from services.balancer.backfill import Backfill
from services.balancer.candidate import Candidate
from services.balancer.decide import Decider, DecisionMetrics, placed_on
from services.balancer.dispatch import Dispatcher
from services.balancer.holds import Holds
from services.balancer.mirror import Mirror
from services.balancer.missed_submits import MissedSubmits
from services.balancer.pipeline import Pipeline
from services.balancer.shards import Shards
from services.balancer.tenancy import TenantLedger
from services.balancer.waiting import Waiting
from services.common.read_back import LEAD_POLL_S
from services.common.service import Service
from shared import telemetry
from shared.bus import Consumer, Delivery
from shared.events import JobSubmit
from shared.policy.placement.balancer import BalancerParams
from shared.policy.placement.registry import PlacementPolicy, describe, get_labelled, parse_label
from shared.policy.reservation import ReservationParams
from shared.settings import BalancerSettings

__all__ = ["Balancer", "Candidate", "placed_on"]

_SUBMIT = msgspec.json.Decoder(JobSubmit)
_PENDING_SCAN = 50_000
"""Most pending jobs per shard the queue gauges read at each refresh (a queue longer than that is undercounted:
its depth, ``migsched_queue_depth``, is read separately and exact)."""


def placement_policy(st: BalancerSettings) -> tuple[BalancerParams, PlacementPolicy | None]:
    """The balancer's parameters (its rule with tenancy, and ``paper``'s own) and the named policy from the
    registry, or None for the ``paper`` family, which the mirror answers incrementally with those parameters."""
    params = BalancerParams(threshold=st.threshold, dynamic=st.dynamic, top_k=max(1, st.top_k))
    name = parse_label(st.policy)[0]
    spec = describe(name)
    if spec.takes_threshold and spec.repartitions:
        _, fn = get_labelled(st.policy, threshold=st.threshold, top_k=max(1, st.top_k))
        bp = getattr(fn, "balancer_params", None)
        if isinstance(bp, BalancerParams):
            return msgspec.structs.replace(bp, dynamic=st.dynamic), None
    kw: dict[str, Any] = ({"top_k": max(1, st.top_k), "minute_s": st.align_minute_s} if name == "migsched"
                          else {})
    return params, get_labelled(st.policy, **kw)[1]


class Balancer(Service):
    """decode (``Candidate``) -> decide (``Decider``, on ``Shards``' mirrors) -> commit (``Pipeline``) -> publish
    (``Dispatcher``) -> ack (the bus); ``Backfill`` runs the queue through the same pipeline."""

    name = "balancer"
    settings: BalancerSettings

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        st = self.settings
        self.params, self.policy = placement_policy(st)
        self.reserves = get_labelled(st.policy)[0].reserves
        self.lock = asyncio.Lock()
        self._refresh_wanted = False
        # tenancy (quotas, priority classes, preemption); inactive without MIGSCHED_TENANCY_FILE
        self.ledger = TenantLedger(st.tenancy_file, st.reserve_full, st.tenancy_poll_s, self.geometry)
        hold = ReservationParams(after_s=st.reserve_after_s, max_held=st.max_reservations,
                                 slack_s=st.reserve_slack_s)
        self.shards = Shards(st.shards, self.geometry, hold, self.ledger, self.state.job_shard,
                             routes_by_start=self.reserves)
        if st.shards > 1:
            self.ledger.shard_of = lambda gpu_id: self.state.node_shard(gpu_id.rpartition("/")[0])
        self.waiting = Waiting()
        metrics = DecisionMetrics()
        decider = Decider(self.shards, self.ledger, self.params, self.policy, self.reserves, self.geometry, metrics,
                          default_hint_s=st.default_hint_s)
        self.dispatcher = Dispatcher(self.bus, self.state, self.geometry, st.max_attempts,
                                     lambda: self.waiting.request(queue_grew=True), self.log)
        self.pipeline = Pipeline(self.state, self.shards, self.ledger, decider, self.dispatcher, self.waiting,
                                 metrics, st.max_rounds, self.name, self.log)
        self.missed = MissedSubmits(self.bus, self.state, self.subjects.stream_jobs, "balancer-submit",
                                    self.subjects.jobs_submit, grace_s=2 * st.ack_wait_s)
        self.backfiller = Backfill(st, self.state, self.shards, self.ledger, self.pipeline, self.dispatcher,
                                   self.waiting, metrics, self.reserves, self.lock, self.name)

    @property
    def mirrors(self) -> list[Mirror]:
        return self.shards.mirrors

    @property
    def holds(self) -> list[Holds]:
        return self.shards.holds

    @property
    def placed(self) -> int:
        return self.pipeline.placed

    async def backfill(self) -> int:
        """One backfill pass now; the jobs it placed."""
        return await self.backfiller.run()

    def consumers(self) -> list[Consumer]:
        s, b = self.subjects, self.bus
        return [
            # two batches in flight: one is decided while the other's placements are being published
            b.consumer(s.stream_jobs, "balancer-submit", s.jobs_submit, self.on_submit, concurrency=2),
            b.consumer(s.stream_jobs, "balancer-cancel", s.jobs_cancel, self.on_cancel),
            # every replica keeps its own mirror, so every replica must hear of every exit and capacity change;
            # the mirror is a cache of Redis, so these go unacknowledged: one message less per job, and an
            # update the handler could not apply (it is not redelivered) reloads the mirror instead. They only
            # feed the mirror, once per replica: no span each (a job's trace shows its exit where it is handled)
            b.consumer(s.stream_jobs, "balancer-exit", s.jobs_exit, self.on_exit, ephemeral=True, acks=False,
                       lost=self._mirror_lost, traced=False),
            b.consumer(s.stream_sched, "balancer-capacity", s.sched_capacity, self.on_capacity, ephemeral=True,
                       acks=False, lost=self._mirror_lost, traced=False),
        ]

    def periodic(self) -> list[tuple[str, float, Any]]:
        st = self.settings
        return [
            ("mirror-refresh", st.mirror_refresh_s, self.refresh),
            # not on every reload: a lost exit reloads the mirror at once, and the gauges read the whole queue
            ("gauges", st.mirror_refresh_s, self.export_gauges),
            ("backfill", 0.02, self.backfiller.tick),
            ("backfill-sweep", 1.0, self._sweep),
            ("refresh-on-demand", 0.2, self._refresh_if_wanted),
            # a consumer of one copy has no leader to lose (``services.common.read_back``)
            *([("missed-submits", LEAD_POLL_S, self.decide_missed_submits)] if st.stream_replicas > 1 else []),
            *([("tenancy-reload", st.tenancy_poll_s, self._poll_tenancy)] if self.ledger.active else []),
        ]

    async def _sweep(self) -> None:
        """The periodic pass: also catches jobs re-queued by other services or replicas."""
        self.waiting.request(queue_grew=True)

    async def _poll_tenancy(self) -> None:
        async with self.lock:
            r = self.ledger.poll()
        if r is not None and r.ok:
            self.waiting.request(queue_grew=True)  # a raised quota may let held jobs start

    async def prepare(self) -> None:
        await self.refresh()
        await self.export_gauges()

    async def refresh(self) -> None:
        """Reload every shard's mirror from Redis."""
        async with self.lock:
            await self.shards.load(self.state)
        self.waiting.request(queue_grew=True)

    async def export_gauges(self) -> None:
        """The queue per tenant and class, the quota book and the cluster's occupancy, as gauges."""
        pending = await self._pending()
        async with self.lock:
            m.cluster(mm.snapshot() for mm in self.mirrors)
            m.tenants(self.ledger.usage(), self.ledger.tenancy.quotas)
        m.queue(pending, await self.state.pending_count(), time.time(), self.ledger.class_name)

    async def _pending(self) -> list[JobSubmit]:
        """Every pending job's submit (up to ``_PENDING_SCAN`` per shard): the ones this replica queued from
        memory, the others from their stored spec."""
        out: list[JobSubmit] = []
        known = self.waiting.specs
        for shard in range(self.shards.count):
            ids = await self.state.pending_ids(shard, _PENDING_SCAN)
            out += [known[j][0] for j in ids if j in known]
            unknown = [j for j in ids if j not in known]
            for rec in await self.state.jobs(unknown) if unknown else ():
                if rec is not None:
                    with contextlib.suppress(msgspec.DecodeError):
                        out.append(_SUBMIT.decode(rec.spec))
        return out

    def _mirror_lost(self, reason: str) -> None:
        """An exit or capacity change the mirror missed: reload it whole (coalesced, within 0.2 s)."""
        self._refresh_wanted = True

    async def _refresh_if_wanted(self) -> None:
        if self._refresh_wanted:
            self._refresh_wanted = False
            await self.refresh()

    # --- jobs.submit ----------------------------------------------------------------------------------------
    async def on_submit(self, ds: list[Delivery]) -> None:
        await self._decide([Candidate(submit=d.data, spec=d.msg.data, ctx=d.ctx, delivery=d) for d in ds])

    async def _decide(self, cands: list[Candidate]) -> None:
        async with self.lock:
            out = await self.pipeline.run(cands)
        # published outside the lock: the reservations are committed, and the next batch can be decided meanwhile
        await self.dispatcher.send(out)

    async def decide_missed_submits(self) -> int:
        """Decide the submits the durable consumer skipped, once a look back finds any; how many it found."""
        missed = await self.missed.poll()
        if not missed:
            return 0
        self.log.warning("%d submits were skipped by consumer balancer-submit when its leader changed, and are "
                         "decided now: %s", len(missed), ", ".join(x.submit.job_id for x in missed[:20]))
        m.MISSED_SUBMITS.inc(len(missed))
        await self._decide([Candidate(submit=x.submit, spec=x.spec, ctx=telemetry.extract(x.headers))
                            for x in missed])
        return len(missed)

    # --- jobs.exit, sched.capacity, jobs.cancel -------------------------------------------------------------
    async def on_exit(self, ds: list[Delivery]) -> None:
        """Apply each exit to the mirror. The release transition itself is already committed: the node
        registry publishes ``jobs.exit`` only after it (so a second release here would always be a no-op), and
        a release never moves the compare-and-set version, so the mirror stays exact without reading Redis."""
        stale: set[str] = set()
        for d in ds:
            e = d.data
            mirror = self.mirrors[self.state.node_shard(e.node)]  # a job's GPUs are all in its shard
            slots = [(s.gpu_id, s.instance_id) for s in e.slots] or [(e.gpu_id, e.instance_id)]
            missed = [g for g, i in slots if not mirror.release(g, i, e.job_id)]
            if len(missed) < len(slots):
                self.ledger.uncharge(e.job_id)
            stale.update(missed)  # the reload re-derives the quota charges of those GPUs' jobs
        if stale:  # the mirror had not seen that placement yet: read those GPUs
            async with self.lock:
                await self.shards.reload(self.state, stale)
        self.waiting.request()

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
            known = {g for g in ids if self.shards.knows(g)}
            await self.shards.reload(self.state, known)
        if ids - known:  # a new GPU (registration): a full reload, coalesced (64 nodes register at once)
            self._refresh_wanted = True
        self.waiting.request(queue_grew=True)  # capacity signals also follow re-queues by other services

    async def on_cancel(self, ds: list[Delivery]) -> None:
        """A job this replica holds as waiting is cancelled here at once, so that no pass places it meanwhile.
        Any other is the node registry's, which consumes the same message: it cancels a queued job and stops a
        placed one (both applying it would record the request twice in a running job's history)."""
        now = time.time()
        b = self.state.batch()
        mine = [d for d in ds if d.data.job_id in self.waiting.specs]
        for d in mine:
            b.cancel(d.data.job_id, d.data.reason or "cancelled by request", now)
        for d in ds:
            self.waiting.left(d.data.job_id)
        if not mine:
            return
        for d, res in zip(mine, await b.run(), strict=True):
            d.span.set_attribute("migsched.cancel", res.status)
