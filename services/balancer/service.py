"""The balancer: decode submits, decide on the local mirror (``shared.policy.balancer.place``), commit every
reservation of the batch as one Redis pipeline of compare-and-set Lua calls, re-decide the losers, publish
``sched.placed``, ack. No room: the job waits in the shard's priority queue with the policy's reasons, and is
tried again (backfill) when room appears: a job exit, a capacity change, or the periodic pass.

Consumers: ``jobs.submit`` (balancer-submit), ``jobs.cancel`` (balancer-cancel), ``jobs.exit`` (balancer-
exit),
``sched.capacity`` (balancer-capacity). All decisions and commits run under one lock, so the mirror is only
changed by one batch at a time; Redis serialises against the other services and replicas.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from opentelemetry import context as otel_context

from services.balancer.mirror import Mirror, reservation_instance
from services.balancer.preempting import (
    admit_job,
    fair_order,
    placed_view,
    record_preemptions,
    wire_priority,
)
from services.balancer.tenancy import TenantLedger
from services.common import metrics as m
from services.common.service import Service
from shared import telemetry
from shared.bus import Consumer, Delivery, Outgoing
from shared.events import JobInfo, JobSubmit, Placed, wire_gpu
from shared.policy.admission import Hold, Start
from shared.policy.balancer import BalancerParams, place
from shared.policy.fragcost import UNIFORM_SHAPES, frag_rate
from shared.policy.placement import CannotPlace, JobRequest, Placement
from shared.settings import BalancerSettings
from shared.state import Eviction, Reservation, shard_of

_SUBMIT = msgspec.json.Decoder(JobSubmit)


@dataclass
class Candidate:
    """One job to decide now: fresh from ``jobs.submit`` or taken from the pending queue."""

    submit: JobSubmit
    spec: bytes
    ctx: otel_context.Context | None
    delivery: Delivery | None = None
    from_queue: bool = False
    attempt: int = 0
    prio: int | None = None
    """The priority resolved from the tenancy's classes (None: the submit's own ``priority``)."""

    @property
    def priority(self) -> int:
        return self.submit.priority if self.prio is None else self.prio

    @property
    def traceparent(self) -> str:
        """The W3C traceparent of ``ctx``, stored with a queued job: its later placement continues it."""
        if self.ctx is None:
            return ""
        carrier: dict[str, str] = {}
        telemetry.inject(carrier, self.ctx)
        return carrier.get("traceparent", "")


class Balancer(Service):
    name = "balancer"
    settings: BalancerSettings

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        st = self.settings
        self.params = BalancerParams(threshold=st.threshold, dynamic=st.dynamic, top_k=max(1, st.top_k))
        self.mirrors = [Mirror(self.geometry) for _ in range(st.shards)]
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
        self._m_decide = m.DECISION_SECONDS.labels(self.name)
        self._m_outcome = {
            o: m.DECISIONS.labels(self.name, o)
            for o in ("placed", "pending", "duplicate", "conflict", "rejected")
        }

    def consumers(self) -> list[Consumer]:
        s, b = self.subjects, self.bus
        return [
            # two batches in flight: one is decided while the other's placements are being published
            b.consumer(s.stream_jobs, "balancer-submit", s.jobs_submit, self.on_submit, concurrency=2),
            b.consumer(s.stream_jobs, "balancer-cancel", s.jobs_cancel, self.on_cancel),
            # every replica keeps its own mirror, so every replica must hear of every exit and capacity change
            b.consumer(s.stream_jobs, "balancer-exit", s.jobs_exit, self.on_exit, ephemeral=True),
            b.consumer(
                s.stream_sched, "balancer-capacity", s.sched_capacity, self.on_capacity, ephemeral=True
            ),
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
        async with self.lock:
            fresh = [Mirror(self.geometry) for _ in range(self.settings.shards)]
            for g in gpus:
                fresh[shard_of(g.node, self.settings.shards)].put(g)
            self.mirrors = fresh
            if self.ledger.active:
                self.ledger.rebuild(mm.snapshot() for mm in fresh)
        m.QUEUE_DEPTH.labels(self.name).set(await self.state.pending_count())
        if len(self.mirrors) == 1 and len(self.mirrors[0]):
            m.FRAG_RATE.labels(self.name).set(frag_rate(self.mirrors[0].snapshot(), UNIFORM_SHAPES))
        self.request_backfill_now(queue_grew=True)

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
        await self.bus.publish_batch(out)
        m.BATCH_SECONDS.labels(self.name, "submit").observe(time.perf_counter() - t0)
        m.BATCH_SIZE.labels(self.name, "submit").observe(len(ds))

    async def decide_and_commit(self, cands: list[Candidate]) -> list[Outgoing]:
        """Decide each job in order on the mirror, commit the batch in one pipeline, re-decide CAS losers;
        return the ``sched.placed`` messages to publish. Call under ``self.lock``."""
        st = self.settings
        out: list[Outgoing] = []
        todo = cands
        for _round in range(st.max_rounds):
            if not todo:
                break
            now = time.time()
            batch = self.state.batch()
            decided: list[tuple[Candidate, Any, int, Any]] = []
            # within a round the mirror only loses room, so a demand that cannot be placed stays so: decide it
            # once
            no_room: dict[tuple[int, Any], CannotPlace] = {}
            # likewise a tenancy hold (the book only grows within a round): per shard, demand, tenant, class
            held: dict[tuple[Any, ...], Any] = {}
            for c in todo:
                sub = c.submit
                shard = shard_of(sub.job_id, st.shards)
                mirror = self.mirrors[shard]
                known = no_room.get((shard, sub.demand))
                if known is not None:
                    decided.append(
                        (
                            c,
                            known,
                            -1
                            if c.from_queue
                            else batch.enqueue(
                                sub.job_id,
                                c.spec,
                                sub.priority,
                                sub.submitted_at,
                                "cannot place: " + "; ".join(known.reasons)[:1000],
                                now,
                                c.traceparent,
                            ),
                            None,
                        )
                    )
                    continue
                why_not = _unsupported(sub)
                if why_not:  # never placeable here: rejected now rather than queued forever
                    batch.settle(sub.job_id, "rejected", why_not, now, ("-", "pending"))
                    self._m_outcome["rejected"].inc()
                    continue
                klass: Any = None
                victims: tuple[Any, ...] = ()
                usage: dict[str, float] = {}
                t0 = time.perf_counter()
                if self.ledger.active:  # quota -> place (behind the reserve) -> preempt
                    hk = (shard, sub.demand, sub.tenant, sub.priority_class, sub.priority)
                    adm = held.get(hk) or admit_job(self.ledger, mirror.snapshot(), c, self.params, now)
                    self._m_decide.observe(time.perf_counter() - t0)
                    if isinstance(adm, str):  # a request error (unknown priority class): never placeable
                        batch.settle(sub.job_id, "rejected", adm[:500], now, ("-", "pending"))
                        self._m_outcome["rejected"].inc()
                        continue
                    klass, c.prio, answer = adm
                    if isinstance(answer, Hold):  # waits: quota | capacity | reserved capacity
                        held[hk] = adm
                        why = f"{answer.reason}: {answer.detail}"[:1000]
                        hold = CannotPlace(
                            job_id=sub.job_id, policy="tenancy", reasons=(why, *answer.reasons)
                        )
                        idx = batch.enqueue(
                            sub.job_id, c.spec, c.priority, sub.submitted_at, why, now, c.traceparent
                        )
                        decided.append((c, hold, idx, None))
                        continue
                    assert isinstance(answer, Start)
                    dec: Placement | CannotPlace = answer.placement
                    victims, usage = answer.victims, answer.usage
                else:
                    req = JobRequest(
                        job_id=sub.job_id,
                        demand=sub.demand,
                        tenant=sub.tenant,
                        priority=sub.priority,
                        latency_sensitive=sub.latency_sensitive,
                        migratable=sub.migratable,
                    )
                    dec = place(mirror.snapshot(), req, self.params)
                    self._m_decide.observe(time.perf_counter() - t0)
                if isinstance(dec, Placement) and not self._single_mig_slot(dec):
                    # never placeable here (it would wait forever): rejected now, with the reason
                    why = (
                        "the live stack places one MIG instance per job; this one needs "
                        f"{len(dec.slots)} x {dec.slot.profile} on {dec.slot.model}"
                    )
                    batch.settle(sub.job_id, "rejected", why, now, ("-", "pending"))
                    self._m_outcome["rejected"].inc()
                    if c.delivery is not None:
                        c.delivery.span.set_attribute("migsched.decision", why)
                    continue
                if isinstance(dec, Placement):
                    slot = dec.slot
                    # the partitioner plans from this view: preempted jobs' instances show idle in it
                    gpu_before = placed_view(mirror.get(slot.gpu_id), victims)
                    inst = reservation_instance(
                        slot, sub.job_id, c.priority, sub.tenant, sub.latency_sensitive, sub.migratable
                    )
                    if klass is not None:
                        inst.pre = klass.preemptible
                    ver = mirror.apply(slot, sub.job_id, inst)
                    r = Reservation(
                        job_id=sub.job_id,
                        gpu_id=slot.gpu_id,
                        expected_ver=ver,
                        instance=inst,
                        action=slot.action,
                        destroy=slot.destroy,
                        max_count=self.geometry.model(slot.model).profile(slot.profile).max_count,
                        spec=c.spec,
                        prio=c.priority,
                        submitted_at=sub.submitted_at,
                        reason=dec.explain()[:500],
                        traceparent=c.traceparent,
                        tenant=sub.tenant if self.ledger.active else "",
                        usage=usage,
                        victims=tuple(
                            Eviction(
                                job_id=v.job_id,
                                instance_id=v.instance_ids[0],
                                reason=f"preempted by {sub.job_id}: {v.detail}"[:500],
                            )
                            for v in victims
                        ),
                    )
                    booked = False
                    if self.ledger.active:  # booked now: the next decision of this batch must see it
                        booked = self.ledger.charge(sub.job_id, sub.tenant, usage, slot.gpu_id)
                        for v in victims:
                            self.ledger.uncharge(v.job_id)
                    decided.append((c, dec, batch.reserve(r, now), (gpu_before, ver, victims, booked)))
                else:
                    no_room[(shard, sub.demand)] = dec
                    reason = "; ".join(dec.reasons)[:1000]
                    idx = (
                        -1
                        if c.from_queue
                        else batch.enqueue(
                            sub.job_id,
                            c.spec,
                            sub.priority,
                            sub.submitted_at,
                            f"cannot place: {reason}",
                            now,
                            c.traceparent,
                        )
                    )
                    decided.append((c, dec, idx, None))
            results = await batch.run() if len(batch) else []
            retry: list[Candidate] = []
            reload: set[str] = set()
            for c, dec, idx, extra in decided:
                if isinstance(dec, CannotPlace):
                    self._queue_maybe_nonempty = True
                    self._m_outcome["pending"].inc()
                    if len(self._waiting) < 100_000:
                        self._waiting[c.submit.job_id] = (c.submit, c.spec, c.ctx)
                    if c.delivery is not None:
                        c.delivery.span.set_attribute("migsched.decision", dec.explain()[:1000])
                    continue
                res = results[idx]
                gpu_before, ver, victims, booked = extra
                self._waiting.pop(c.submit.job_id, None)
                if res.ok:
                    self._m_outcome["placed"].inc()
                    self.placed += 1
                    c.attempt = int(res.detail or 0)
                    if victims:
                        record_preemptions(self.ledger, self.log, c, victims, now)
                        self.request_backfill_now(queue_grew=True)  # the victims wait to run again
                    placed = self._placed(c, dec, gpu_before, ver, now)
                    if victims:
                        placed = msgspec.structs.replace(placed, preempted=tuple(v.job_id for v in victims))
                    out.append(Outgoing(self.subjects.sched_placed, placed, c.ctx))
                    if c.delivery is not None:
                        sp = c.delivery.span
                        sp.set_attribute("migsched.decision", dec.explain()[:1000])
                        sp.set_attribute("migsched.gpu", dec.slot.gpu_id)
                        sp.set_attribute("migsched.frag_after", dec.frag_after)
                    continue
                reload.add(dec.slot.gpu_id)  # also re-derives the quota charges of that GPU's jobs
                if booked:
                    self.ledger.uncharge(c.submit.job_id)
                if res.status == "known":
                    self._m_outcome["duplicate"].inc()  # a replayed submit: nothing to do
                    continue
                m.CONFLICTS.labels(self.name).inc()
                self._m_outcome["conflict"].inc()
                self.log.debug("reservation of %s lost: %s %s", c.submit.job_id, res.status, res.detail)
                retry.append(c)
            await self._reload(reload)
            todo = retry
        if todo:  # still losing races after max_rounds: wait in the queue, the next backfill tries again
            b = self.state.batch()
            for c in todo:
                b.enqueue(
                    c.submit.job_id,
                    c.spec,
                    c.priority,
                    c.submit.submitted_at,
                    f"lost {st.max_rounds} compare-and-set races",
                    time.time(),
                    c.traceparent,
                )
            await b.run()
            self.request_backfill_now(queue_grew=True)
        return out

    def _single_mig_slot(self, dec: Placement) -> bool:
        if len(dec.slots) != 1:
            return False
        s = dec.slot
        try:
            return self.geometry.model(s.model).has_profile(s.profile)
        except Exception:
            return False

    def _placed(self, c: Candidate, dec: Placement, gpu_before: Any, ver: int, now: float) -> Placed:
        sub = c.submit
        return Placed(
            id=f"placed:{sub.job_id}:{c.attempt}",
            job_id=sub.job_id,
            placement=dec,
            gpu=wire_gpu(gpu_before),
            gpu_version=ver,
            attempt=c.attempt,
            decided_at=now,
            job=JobInfo(
                tenant=sub.tenant,
                priority=wire_priority(c.priority),
                latency_sensitive=sub.latency_sensitive,
                migratable=sub.migratable,
                duration_hint_s=sub.duration_hint_s,
                workload=sub.workload,
                submitted_at=sub.submitted_at,
            ),
        )

    # --- backfill -------------------------------------------------------------------------------------------
    def request_backfill_now(self, queue_grew: bool = False) -> None:
        self._backfill_wanted.set()
        if queue_grew:
            self._queue_maybe_nonempty = True

    async def request_backfill(self) -> None:
        """The periodic sweep: also catches jobs re-queued by other services or replicas."""
        self.request_backfill_now(queue_grew=True)

    async def _backfill_tick(self) -> None:
        # coalesces every exit/capacity signal of the last tick into one pass over the queue head; skips the
        # pass
        # (a Redis read) while the queue is known to be empty
        if self._backfill_wanted.is_set() and self._queue_maybe_nonempty:
            self._backfill_wanted.clear()
            if await self.backfill() == 0 and await self.state.pending_count() == 0:
                self._queue_maybe_nonempty = False

    async def backfill(self) -> int:
        """Try the head of each shard's queue (priority, then age) on the mirror; return jobs placed."""
        st = self.settings
        placed_before = self.placed
        now = time.time()
        depth = 0
        for shard in range(st.shards):
            ids = await self.state.pending_ids(shard, st.backfill_batch)
            depth += len(ids)
            if not ids:
                continue
            unknown = [j for j in ids if j not in self._waiting]
            records = (
                {j.job_id: j for j in await self.state.jobs(unknown) if j is not None} if unknown else {}
            )
            cands: list[Candidate] = []
            expired = self.state.batch()
            for jid in ids:
                preempted = False
                if jid in self._waiting:
                    sub, spec, ctx = self._waiting[jid]
                    attempts = 0
                else:
                    rec = records.get(jid)
                    if rec is None:
                        continue
                    spec, attempts, preempted = rec.spec, rec.attempts, rec.preempted > 0
                    ctx = telemetry.extract({"traceparent": rec.traceparent}) if rec.traceparent else None
                    try:
                        sub = _SUBMIT.decode(spec)
                    except msgspec.DecodeError:
                        expired.settle(jid, "rejected", "stored spec unreadable", now, ("pending",))
                        continue
                # a preempted job keeps its submit time for its place in the queue, not to run out of patience
                if not preempted and sub.patience_s is not None and now - sub.submitted_at > sub.patience_s:
                    expired.settle(
                        jid,
                        "rejected",
                        f"waited longer than its patience {sub.patience_s:g}s",
                        now,
                        ("pending",),
                    )
                    self._m_outcome["rejected"].inc()
                    self._waiting.pop(jid, None)
                    continue
                # the job's own trace continues from the queue (its traceparent was stored with it)
                cands.append(Candidate(submit=sub, spec=spec, ctx=ctx, from_queue=True, attempt=attempts))
            if len(expired):
                await expired.run()
            async with self.lock:
                if self.ledger.active:  # priority, then fair share between tenants, then age
                    cands = fair_order(self.ledger, self.mirrors[shard].snapshot(), cands)
                out = await self.decide_and_commit(cands)
            await self.bus.publish_batch(out)
        m.QUEUE_DEPTH.labels(self.name).set(depth)
        return self.placed - placed_before

    # --- jobs.exit, sched.capacity, jobs.cancel -------------------------------------------------------------
    async def on_exit(self, ds: list[Delivery]) -> None:
        """Apply each exit to the mirror. The release transition itself is already committed: the node
        registry
        publishes ``jobs.exit`` only after it (so a second release here would always be a no-op), and a
        release
        never moves the compare-and-set version, so the mirror stays exact without reading Redis."""
        stale: set[str] = set()
        for d in ds:
            e = d.data
            mirror = self.mirrors[shard_of(e.node, self.settings.shards)]
            if mirror.release(e.gpu_id, e.instance_id, e.job_id):
                self.ledger.uncharge(e.job_id)
            else:
                stale.add(e.gpu_id)  # the reload re-derives the quota charges of that GPU's jobs
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


def _unsupported(sub: JobSubmit) -> str:
    """Why the live stack can never place this job ('' when it can): it reserves one MIG instance per job."""
    d = sub.demand
    if d.kind == "gpus" and d.gpus > 1:
        return f"the live stack places one MIG instance per job; {d.gpus} whole GPUs were asked"
    if d.kind == "shared":
        return "the live stack places MIG instances only; time-sliced shares are not supported yet"
    return ""
