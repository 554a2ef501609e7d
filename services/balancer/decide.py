"""The balancer's batch decision and commit: ``decide_and_commit`` decides each job of a batch on its shard's
mirror (``Mirror.decide``, which is ``shared.policy.balancer.place``'s decision; with tenancy: quota -> place
behind the reserve -> preempt), commits every reservation of the batch as one Redis pipeline of compare-and-set
Lua calls, re-decides the losers and returns the messages to publish with ``send``: each placement's executor
command (``cmd.<node>``). No room: the job waits in the shard's priority queue with the policy's reasons.
``Candidate`` is one job to decide.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import msgspec
from prometheus_client import Counter, Histogram

from services.balancer.candidate import Candidate
from services.balancer.holds import Holds
from services.balancer.mirror import Mirror, reservation_instance
from services.balancer.preempting import admit_job, placed_view, record_preemptions, wire_priority
from services.balancer.tenancy import TenantLedger
from services.common import metrics as m
from services.common.place_command import place_cmd_id, place_command
from services.common.service import Service
from shared.bus import Outgoing
from shared.events import Command, JobInfo, JobSubmit, Placed, wire_gpu
from shared.policy.admission import Hold, Start
from shared.policy.balancer import BalancerParams
from shared.policy.charges import slot_usages
from shared.policy.gang import node_sizes, spans_nodes
from shared.policy.placement import CannotPlace, JobRequest, Placement, Slot
from shared.policy.registry import PlacementPolicy
from shared.policy.request import Demand
from shared.policy.snapshot import ClusterSnapshot
from shared.settings import BalancerSettings
from shared.state import Eviction, Reservation, SlotReservation, shard_of
from shared.state.model import PLAIN_PROFILES


class Decisions(Service):
    """The decide/commit half of ``Balancer``, which sets these attributes (and the backfill methods)."""

    settings: BalancerSettings
    params: BalancerParams
    policy: PlacementPolicy | None
    """The registry's policy; None for the ``paper`` family, which the mirror answers with ``params``."""
    reserves: bool
    """The policy holds GPUs for large waiting jobs (not with tenancy, whose quota path has its own reserve)."""
    holds: list[Holds]
    mirrors: list[Mirror]
    lock: asyncio.Lock
    ledger: TenantLedger
    placed: int
    _queue_maybe_nonempty: bool
    _waiting: dict[str, tuple[JobSubmit, bytes, Any]]
    _m_decide: Histogram
    _m_outcome: dict[str, Counter]

    if TYPE_CHECKING:

        def request_backfill_now(self, queue_grew: bool = False) -> None: ...

        async def _reload(self, gpu_ids: set[str]) -> None: ...

    async def decide_and_commit(self, cands: list[Candidate]) -> list[Outgoing]:
        """Decide each job in order on the mirror, commit the batch in one pipeline, re-decide CAS losers;
        return the messages to publish (``send``). Call under ``self.lock``."""
        st = self.settings
        out: list[Outgoing] = []
        unplannable: list[Placed] = []
        todo = cands
        for _round in range(st.max_rounds):
            if not todo:
                break
            now = time.time()
            batch = self.state.batch()
            decided: list[tuple[Candidate, Any, int, Any]] = []
            # within a round the mirror only loses room, so a demand that cannot be placed stays so: decide it
            # once
            no_room: dict[tuple[int, Any, frozenset[str]], CannotPlace] = {}
            # likewise a tenancy hold (the book only grows within a round): per shard, demand, tenant, class
            held: dict[tuple[Any, ...], Any] = {}
            for c in todo:
                sub = c.submit
                shard = shard_of(sub.job_id, st.shards)
                mirror = self.mirrors[shard]
                blocked = (frozenset(self.holds[shard].blocked(sub.job_id, sub.duration_hint_s, now))
                           if self.reserves and not self.ledger.active else frozenset())
                known = no_room.get((shard, sub.demand, blocked))
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
                klass: Any = None
                victims: tuple[Any, ...] = ()
                usage: dict[str, float] = {}
                t0 = time.perf_counter()
                dec: Placement | CannotPlace
                too_big = (bigger_than_every_node(mirror.view(), sub.job_id, sub.demand)
                           if sub.demand.kind == "gpus" else None)
                if too_big is not None:  # decided before any policy or preemption spends work on it
                    dec = too_big
                elif self.ledger.active:  # quota -> place (behind the reserve) -> preempt
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
                        hold = CannotPlace(job_id=sub.job_id, policy="tenancy", reasons=(why, *answer.reasons))
                        idx = batch.enqueue(sub.job_id, c.spec, c.priority, sub.submitted_at, why, now, c.traceparent)
                        decided.append((c, hold, idx, None))
                        continue
                    assert isinstance(answer, Start)
                    dec = answer.placement
                    victims, usage = answer.victims, answer.usage
                else:
                    req = JobRequest(
                        job_id=sub.job_id,
                        demand=sub.demand,
                        tenant=sub.tenant,
                        priority=sub.priority,
                        latency_sensitive=sub.latency_sensitive,
                        migratable=sub.migratable,
                        duration_hint_s=sub.duration_hint_s,
                        now=now,
                    )
                    dec = mirror.decide(req, self.params, self.policy, blocked)  # applied below
                    self._m_decide.observe(time.perf_counter() - t0)
                if isinstance(dec, Placement) and len(dec.slots) > 1 and dec.slot.profile not in PLAIN_PROFILES:
                    dec = mig_gang_refused(dec)  # waits for plain GPUs (see mig_gang_refused)
                if isinstance(dec, Placement):
                    self.holds[shard].placed(sub.job_id)
                    slot = dec.slot
                    # the partitioner plans from this view: preempted jobs' instances show idle in it
                    gpu_before = placed_view(mirror.get(slot.gpu_id), victims)
                    victim_jobs = {v.job_id for v in victims}
                    slot_res: list[SlotReservation] = []
                    for s in dec.slots:
                        inst = reservation_instance(
                            s, sub.job_id, c.priority, sub.tenant, sub.latency_sensitive, sub.migratable,
                            now + sub.duration_hint_s if sub.duration_hint_s else 0.0,
                        )
                        if klass is not None:
                            inst.pre = klass.preemptible
                        ver = mirror.apply(s, sub.job_id, inst, victim_jobs)
                        slot_res.append(
                            SlotReservation(
                                gpu_id=s.gpu_id,
                                expected_ver=ver,
                                instance=inst,
                                action=s.action,
                                destroy=s.destroy,
                                max_count=self._max_count(s),
                            )
                        )
                    first = slot_res[0]
                    ver = first.expected_ver
                    r = Reservation(
                        job_id=sub.job_id,
                        gpu_id=first.gpu_id,
                        expected_ver=first.expected_ver,
                        instance=first.instance,
                        action=first.action,
                        destroy=first.destroy,
                        max_count=first.max_count,
                        extra=tuple(slot_res[1:]),
                        track=True,
                        spec=c.spec,
                        prio=c.priority,
                        submitted_at=sub.submitted_at,
                        reason=dec.explain(runners_up=3)[:1000],
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
                        split = slot_usages(mirror.snapshot(), dec, sub.demand) if len(dec.slots) > 1 else (usage,)
                        per_gpu = {s.gpu_id: u for s, u in zip(dec.slots, split, strict=True)}
                        booked = self.ledger.charge(sub.job_id, sub.tenant, per_gpu)
                        for v in victims:
                            self.ledger.uncharge(v.job_id)
                    decided.append((c, dec, batch.reserve(r, now), (gpu_before, ver, victims, booked)))
                else:
                    no_room[(shard, sub.demand, blocked)] = dec
                    if c.from_queue and self.reserves and not self.ledger.active:
                        gpus_held = self.holds[shard].consider(mirror.view(), sub, now)
                        if gpus_held is not None:
                            why = f"reserved: {gpus_held.explain()}"
                            dec = msgspec.structs.replace(dec, reasons=(why, *dec.reasons))
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
                        # a victim's instances on GPUs outside this placement (a gang) were freed too
                        reload.update(g for v in victims for g in v.gpu_ids if g not in placed_on(dec))
                    placed = self._placed(c, dec, gpu_before, ver, now)
                    if victims:
                        placed = msgspec.structs.replace(placed, preempted=tuple(v.job_id for v in victims))
                    cmd = self._command(placed, c, now)
                    if cmd is not None:
                        out.append(cmd)
                    else:
                        unplannable.append(placed)
                    if c.delivery is not None:
                        sp = c.delivery.span
                        sp.set_attribute("migsched.decision", dec.explain()[:1000])
                        sp.set_attribute("migsched.gpu", dec.slot.gpu_id)
                        sp.set_attribute("migsched.frag_after", dec.frag_after)
                    continue
                reload.update(placed_on(dec))  # also re-derives the quota charges of those GPUs' jobs
                if booked:
                    self.ledger.uncharge(c.submit.job_id)
                if res.status == "known":
                    self._m_outcome["duplicate"].inc()  # a replayed submit: nothing to do
                    continue
                m.child(m.CONFLICTS, self.name).inc()
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
        await self._fail_unplannable(unplannable)
        return out

    def _command(self, placed: Placed, c: Candidate, now: float) -> Outgoing | None:
        """The executor's ``place`` command for a committed placement; None for one that cannot be planned
        (the compare-and-set on the same view rules that out), which ``_fail_unplannable`` then fails."""
        cmd = place_command(placed, self.geometry, now)
        if not isinstance(cmd, Command):
            self.log.error("placement of %s cannot be planned: %s", placed.job_id, cmd.reason)
            return None
        m.count_reconfigurations(cmd.ops)
        if c.delivery is not None:
            c.delivery.span.set_attribute("migsched.ops", len(cmd.ops))
        return Outgoing(self.subjects.cmd(cmd.node), cmd, c.ctx)

    async def _fail_unplannable(self, placed: list[Placed]) -> None:
        """Give back the placements no command could be planned for, by their command ids (the reservation
        tracked them): each job is queued again, or fails after ``MIGSCHED_MAX_ATTEMPTS``."""
        if not placed:
            return
        now = time.time()
        for p in placed:
            cid = place_cmd_id(p.job_id, p.attempt)
            await self.state.fail_placement(p.job_id, "partition plan conflict", now, self.settings.max_attempts,
                                            cid, p.attempt)
        self.request_backfill_now(queue_grew=True)

    async def send(self, out: list[Outgoing]) -> None:
        """Publish a batch's messages. The place commands among them are tracked in ``:cmds`` already: each
        reservation recorded its command in the same transition (``Reservation.track``)."""
        await self.bus.publish_batch(out)
        sent = sum(1 for o in out if isinstance(o.msg, Command))
        if sent:
            m.child(m.COMMANDS, "place", "sent").inc(sent)

    def _max_count(self, slot: Slot) -> int:
        if slot.profile in PLAIN_PROFILES:
            return 1  # unused: a whole GPU is exclusive, shares are bounded by the GPU's replicas
        return self.geometry.model(slot.model).profile(slot.profile).max_count

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


def placed_on(dec: Placement) -> list[str]:
    return [s.gpu_id for s in dec.slots]


def bigger_than_every_node(snap: ClusterSnapshot, job_id: str, demand: Demand) -> CannotPlace | None:
    """A gang bigger than every node waits in the live stack with this reason: the state store's reservation and
    the executors' launch take one node's GPUs (the simulator places such a gang across nodes)."""
    if not spans_nodes(snap, demand):
        return None
    largest = int(node_sizes(snap).max())
    why = (f"needs {demand.gpus} GPUs on one node; the largest node has {largest} "
           "(the live stack runs a gang on one node)")
    return CannotPlace(job_id=job_id, policy="balancer", reasons=(why,))


def mig_gang_refused(dec: Placement) -> CannotPlace:
    """``gpus: n > 1`` that only fits on n entirely free MIG GPUs: CUDA enumerates one MIG device per process,
    so a gang bound to n MIG instances would see one GPU. It waits for n plain (non-MIG) GPUs on one node."""
    return CannotPlace(
        job_id=dec.job_id,
        policy=dec.policy,
        reasons=(
            f"{len(dec.slots)} whole GPUs fit only as MIG instances ({dec.slot.profile} on node {dec.slot.node}); "
            "a process sees one MIG device, so a gang waits for non-MIG GPUs",
        ),
    )
