"""The event loop: arrivals, exits, reconfiguration and migration completions, defragmentation ticks,
timeouts.

The engine owns no policy: it asks ``policy(snapshot, request)`` for every placement, ``plan_partition`` (via
``SimCluster``) for the MIG operations, and the migration planner for moves, exactly as the services do. What it
adds is time: reconfiguration latency per GPU-instance operation, migration downtime and lost progress, queueing
with patience, and the interference slowdown. See docs/simulator.md for the model.

Past 400 lines on purpose: the per-event bookkeeping (start, join, leave, respeed) stays in one class because it
runs for every event of a 100k-job run, where a call through another object per event costs measurably.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import Counter
from collections.abc import Callable
from heapq import heappop
from typing import Any

from shared.mig.geometry import Geometry, default_geometry
from shared.policy.migration.unblock import UnblockParams
from shared.policy.placement.decision import Slot
from shared.policy.placement.gang import never_fits
from shared.policy.placement.topology import never_within
from shared.policy.reservation import Reservation, ReservationParams, expected_run
from shared.policy.retention import RecentDemand
from shared.policy.snapshot import InstanceView
from shared.sim import backfill, invariants, moves, placer, release, reserving
from shared.sim import events as ev
from shared.sim.cluster import ClusterSpec, SimCluster
from shared.sim.config import SimConfig
from shared.sim.errors import InvariantError
from shared.sim.interference import Interference
from shared.sim.jobs import DONE, FUTURE, QUEUED, REJECTED, RUNNING, STARTING, SimJob, Workload
from shared.sim.layouts import lay_out
from shared.sim.metrics import Outcome, Recorder, RunResult
from shared.sim.run import Policy, Spec

ARRIVED = ev.Event(0.0, ev.ARRIVAL, 0, -1, 0)
"""Stands for an arrival event when no hook will read it (building one per arrival is measurable)."""


class Simulator:
    """One run of one policy over one workload on one cluster (a ``SimRun``). Call ``run()`` once."""

    def __init__(
        self,
        workload: Workload,
        cluster: ClusterSpec,
        spec: Spec,
        policy: Policy,
        config: SimConfig | None = None,
        *,
        geometry: Geometry | None = None,
        hook: Callable[[Simulator, ev.Event], None] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.workload, self.spec, self.policy = workload, spec, policy
        self.cfg = config or SimConfig()
        self.geometry = geometry or default_geometry()
        self.cluster = SimCluster(self.geometry, cluster)
        self.blocks = cluster.blocks()
        """The cluster's topology blocks: the domains of a gang kept within one."""
        sizes = {n.name: n.gpus for n in cluster.nodes}
        self.block_gpus = {b: sum(sizes[n] for n in ns) for b, ns in self.blocks}
        self.hook, self.progress = hook, progress
        self.jobs = workload.jobs
        n = len(self.jobs)
        self.index = {j.id: i for i, j in enumerate(self.jobs)}
        if len(self.index) != n:
            dup = next(k for k, c in Counter(j.id for j in self.jobs).items() if c > 1)
            raise InvariantError(f"workload {workload.name!r} repeats job id {dup!r}")
        self.state = [FUTURE] * n
        self.work = [j.duration for j in self.jobs]
        self.speed = [1.0] * n
        self.t_last = [0.0] * n
        self.epoch = [0] * n
        self.insts: list[tuple[str, ...]] = [()] * n
        self.moving: list[moves.InFlight | None] = [None] * n
        self.chain: dict[int, list[Any]] = {}
        self.out = Outcome(n)
        self.queue: list[tuple[int, float, int]] = []
        self.q = ev.EventQueue()
        self.now = self.jobs[0].arrival if n else 0.0
        self.freed: list[str] = []
        """GPUs in the order room was freed on them; ``version`` = its length (see _schedule's memo)."""
        self.profiles: dict[tuple[str, str], tuple[int, ...]] = {}
        """(shape, model) -> the slice masks of the profile's placements (none: no such profile)."""
        self.failed: dict[tuple[str, int], int] = {}
        self.memo_keys = [(j.demand.label() + _within(j), j.gpus) for j in self.jobs]
        """Per job, the demand its failures are remembered under (see _schedule)."""
        self.pressure: dict[str, dict[int, float]] = {}
        self.gpu_free_at: dict[str, float] = {}
        self.demand = RecentDemand(self.cfg.retention.window_s)
        """Placements per profile in the retention window, as the node registry counts them."""
        self.interf = Interference(self.cfg.interference)
        self.events = 0
        self.moves_started = 0
        self.moves_skipped = 0
        self.last_move_at = -math.inf
        self.defrag_memo: tuple[int, float] | None = None
        self.reserves = bool(getattr(spec, "reserves", False))
        self.reservation_params = ReservationParams(after_s=self.cfg.reserve_after_s,
                                                    max_held=self.cfg.max_reservations,
                                                    slack_s=self.cfg.reserve_slack_s)
        self.unblocks = bool(getattr(spec, "unblocks", False))
        self.unblock_params = UnblockParams(max_moves=2, min_left_s=self.cfg.unblock_min_left_s)
        self.pinned: dict[int, Reservation] = {}
        """Job -> the GPU being emptied for it by unblocking moves (``shared.policy.migration.unblock``)."""
        self.reservations: list[Reservation] = []
        """Held for large waiting jobs, as the last queue pass planned them (``shared.sim.reserving``)."""
        self.reserved_idle_s = 0.0
        self.gpu_total = len(self.cluster.views)
        self.largest_node = max((len(v) for v in self.cluster.node_gpus.values()), default=0)
        """GPUs on the largest node: a bigger gang spans nodes (``shared.policy.placement.gang``)."""
        self.refused: dict[str, int] = {}
        """Jobs rejected on arrival because no set of nodes could ever host them, per reason."""
        self.held_free = 0.0
        self.held_since = self.now
        self.mig = None
        if spec.migrates:
            from shared.policy.migration import planner as migration

            self.mig = migration
            self.mig_params = moves.migration_params(spec, self.cfg)
        self.layouts = lay_out(self.cluster, self.geometry, self.spec.initial_layout, workload)
        """Each GPU's initial layout (``shared.sim.layouts``): what a static baseline restores."""
        if self.mig is not None:
            # the planner's pull sources and the screens of exits and ticks, kept incrementally
            # (shared.policy.migration.pull_index, shared.policy.migration.gate): the same moves, fewer plans
            self.cluster.attach_pull_index(self.mig_params.threshold, self.mig_params.cooldown_s)
            self.cluster.attach_defrag_screen(self.mig_params)
        self.placer, self.align = placer.attach(self.cluster, policy)
        self.long_gangs = placer.long_gangs(self.cluster, self.jobs, self.align, self.hint)
        """Jobs the policy's long-gang rule may keep waiting: whether one fits depends on the clock too, so their
        failures are not remembered (``backfill``)."""

    def hint(self, i: int) -> float | None:
        """Job ``i``'s duration hint: its run time times ``hint_factor``; None when jobs give no hints."""
        factor = self.cfg.hint_factor
        return self.jobs[i].duration * factor if factor > 0 else None

    @property
    def version(self) -> int:
        return len(self.freed)

    # the loop ----------------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        wall0 = time.perf_counter()
        jobs, q = self.jobs, self.q
        n = len(jobs)
        rec = Recorder(self, self.cfg.samples)
        self.rec = rec
        nxt = 0
        if self.mig is not None and n:
            q.push(self.now + self.cfg.defrag_interval_s, ev.DEFRAG)
        handlers = {
            ev.EXIT: self._on_exit,
            ev.MIGRATION_DONE: self._on_move_done,
            ev.RECONFIG_DONE: self._on_ready,
            ev.TIMEOUT: self._on_timeout,
            ev.DEFRAG: self._on_defrag,
        }
        arrivals = [j.arrival for j in jobs]
        heap = q.heap
        state, epoch = self.state, self.epoch
        hook, check, progress = self.hook, self.cfg.check_invariants, self.progress
        cluster = self.cluster
        while True:
            # arrivals are read from the sorted workload rather than pushed: half the heap traffic; an arrival
            # goes first unless the next event is earlier, or as early and of a kind ordered before arrivals
            if nxt < n and (not heap or arrivals[nxt] < heap[0].time
                            or (arrivals[nxt] == heap[0].time and heap[0].kind > ev.ARRIVAL)):
                t = arrivals[nxt]
                e = None
            elif heap:
                e = heappop(heap)  # q.pop(), without its call
                if e.kind == ev.DEFRAG and nxt >= n and (self.out.live == 0 or cluster.used == 0):
                    continue  # nothing left to defragment: stop ticking so the run can end
                t = e.time
            else:
                break
            if t > rec.t_prev:
                if t < rec.next_sample:  # Recorder.advance with no sample due, without its call
                    rec.area += cluster.used * (t - rec.t_prev)
                    rec.t_prev = t
                else:
                    rec.advance(t)
            self.now = t
            if e is None:
                event = ev.Event(t, ev.ARRIVAL, 0, nxt, 0) if hook is not None else ARRIVED
                self._on_arrival(nxt)
                nxt += 1
            else:
                # the stale tests of _on_exit and _on_timeout, without their calls: most exits popped were moved by
                # _respeed, most timeouts are of jobs placed long before (a subclass's handlers skip these too)
                if e.kind == ev.EXIT:
                    if state[e.job] != RUNNING or epoch[e.job] != e.epoch:
                        continue
                elif e.kind == ev.TIMEOUT and state[e.job] != QUEUED:
                    continue
                event = e
                if not handlers[e.kind](e):
                    continue
            self.events += 1
            if hook is not None:
                hook(self, event)
            if check:
                self.check()
            if progress is not None and self.events % 4096 == 0:
                progress(self.out.ended, n)
        for i in list(self._queued()):  # nothing left that could free room: the rest starve
            self._reject(i)
        return rec.result(wall_s=time.perf_counter() - wall0)

    # handlers (each returns False when the event was stale) ------------------------------------------------
    def _on_arrival(self, i: int) -> None:
        job = self.jobs[i]
        self.state[i] = QUEUED
        self.out.live += 1
        why = never_fits(job.demand, self.gpu_total)
        if why is None and job.within_block and job.demand.kind == "gpus":
            why = never_within(job.demand.gpus, "block", self.block_gpus)
        if why is not None:  # rejected at once: waiting could never help
            self.refused[why] = self.refused.get(why, 0) + 1
            self._reject(i)
            return
        bisect.insort(self.queue, (-job.priority, job.arrival, i))
        self._schedule()
        # The timeout goes in only for a job the pass left queued: most are placed on arrival, and their timeout
        # was a heap push and pop per job for nothing. Exact: only a queued job can time out (a job placed and
        # later queued again is a preempted one, which never times out), and at equal times timeouts keep their
        # order (their seq still follows arrival order; the kind orders them against every other event).
        if self.state[i] == QUEUED:
            patience = job.patience if job.patience is not None else self.cfg.patience_s
            if math.isfinite(patience):
                self.q.push(self.now + patience, ev.TIMEOUT, i)

    def _on_timeout(self, e: ev.Event) -> bool:
        if self.state[e.job] != QUEUED:
            return False
        self.queue.remove((-self.jobs[e.job].priority, self.jobs[e.job].arrival, e.job))
        self._reject(e.job)
        return True

    def _reject(self, i: int) -> None:
        self.state[i] = REJECTED
        self.out.reject(i, self.now)

    def _on_ready(self, e: ev.Event) -> bool:
        if self.state[e.job] != STARTING or self.epoch[e.job] != e.epoch:
            return False
        self._begin(e.job)
        return True

    def _on_exit(self, e: ev.Event) -> bool:
        i = e.job
        if self.state[i] != RUNNING or self.epoch[i] != e.epoch:
            return False
        self.state[i] = DONE
        self.out.complete(i, self.now)
        mv = self.moving[i]
        if mv is not None:  # finished during its move: the reserved destination is simply released
            self.moving[i] = None
            self.free(mv.dst)
        freed: list[str] = []
        for iid in self.insts[i]:
            freed.append(self.cluster.where[iid])
            self.free(iid, i)
        self.after_free()
        if self.mig is not None and len(self.insts[i]) == 1:
            self._start_chain(moves.after_exit(self, freed[0]))
        if mv is not None:
            self._continue_chain(i)
        return True

    def _on_move_done(self, e: ev.Event) -> bool:
        return moves.on_move_done(self, e)

    def _on_defrag(self, e: ev.Event) -> bool:
        return moves.on_defrag(self, e)

    # placement ---------------------------------------------------------------------------------------------
    def _queued(self) -> list[int]:
        return [k[2] for k in self.queue]

    def _schedule(self) -> None:
        """One bounded pass over the queue in priority-then-age order (shared/sim/backfill.py), holding GPUs
        for large jobs when the policy reserves (shared/sim/reserving.py)."""
        if self.reserves:
            reserving.schedule(self)
        else:
            backfill.schedule(self)

    def _may_fit_since(self, job: SimJob, version: int) -> bool:
        return backfill.may_fit_since(self, job, version)

    def template(self, i: int) -> InstanceView:
        j = self.jobs[i]
        expected = expected_run(self.hint(i), self.cfg.default_hint_s)
        return InstanceView(
            id="",
            profile="",
            start=0,
            size=1,
            compute=1,
            job_id=j.id,
            migratable=j.migratable,
            latency_sensitive=j.latency_sensitive,
            priority=j.priority,
            tenant=j.tenant,
            started_at=self.now,
            ends_at=None if expected is None else self.now + expected,
        )

    def ops_ready(self, gpu_id: str, ops: int) -> float:
        """Operations on one GPU run one after the other; different GPUs reconfigure in parallel."""
        if ops == 0:
            return self.now
        t = max(self.now, self.gpu_free_at.get(gpu_id, -math.inf)) + ops * self.cfg.reconfig_latency_s
        self.gpu_free_at[gpu_id] = t
        return t

    def start(self, i: int, slots: tuple[Slot, ...]) -> None:
        template = self.template(i)
        ids: list[str] = []
        ready = self.now
        for slot in slots:
            iid, ops = self.cluster.apply_slot(slot, template, self.jobs[i].id)
            self.demand.observe(slot.profile, self.now)
            ids.append(iid)
            if ops:  # none (a reuse) is ready now, which ``ready`` already is at least
                ready = max(ready, self.ops_ready(slot.gpu_id, ops))
        self.insts[i] = tuple(ids)
        self.out.placed(i, self.now)
        if ready > self.now:
            self.state[i] = STARTING
            self.epoch[i] += 1
            self.q.push(ready, ev.RECONFIG_DONE, i, self.epoch[i])
        else:
            self._begin(i)

    def _begin(self, i: int) -> None:
        self.state[i] = RUNNING
        self.out.started(i, self.now)
        self.t_last[i] = self.now
        for iid in self.insts[i]:
            self.join(i, iid)

    # interference ------------------------------------------------------------------------------------------
    def advance(self, i: int) -> None:
        self.work[i] = max(0.0, self.work[i] - (self.now - self.t_last[i]) * self.speed[i])
        self.t_last[i] = self.now

    def join(self, i: int, iid: str) -> None:
        cluster = self.cluster
        gid = cluster.where[iid]
        inst = cluster.views[gid].instance(iid)
        assert inst is not None
        gpu_compute = cluster.models[gid].compute_slices
        self.pressure.setdefault(gid, {})[i] = self.interf.pressure(
            self.jobs[i].wclass, inst.compute, gpu_compute
        )
        self._respeed(gid, new=i)

    def leave(self, i: int, gid: str) -> None:
        on = self.pressure.get(gid)
        if on is not None and on.pop(i, None) is not None:
            self._respeed(gid)

    def _respeed(self, gid: str, new: int = -1) -> None:
        """Give every running job on ``gid`` its speed under the current co-runners; move their exits."""
        on = self.pressure[gid]
        total = sum(on.values())
        speed, epoch, now, work, t_last = self.speed, self.epoch, self.now, self.work, self.t_last
        beta, push = self.interf.beta, self.q.push
        for j, own in on.items():
            # Interference.speed, inlined (the same arithmetic, so the same floats): once per co-runner
            others = total - own
            s = 1.0 if others <= 1e-12 or beta == 0.0 else 1.0 / (1.0 + beta * others)
            if j == new or s != speed[j]:
                if j != new:
                    # advance, inlined: this runs for every co-runner of every start and exit
                    work[j] = max(0.0, work[j] - (now - t_last[j]) * speed[j])
                t_last[j] = now
                speed[j] = s
                epoch[j] += 1
                push(now + work[j] / s, ev.EXIT, j, epoch[j])

    # freeing (shared/sim/release.py) ---------------------------------------------------------------------
    free = release.free  # a method without a wrapper's call: it runs for every freed instance

    def after_free(self) -> None:
        self._schedule()

    # migration (shared/sim/moves.py) and invariants (shared/sim/invariants.py) -----------------------------
    def _start_chain(self, planned: tuple[Any, ...]) -> None:
        moves.start_chain(self, planned)

    def _continue_chain(self, i: int) -> None:
        moves.continue_chain(self, i)

    def check(self) -> None:
        """Invariants at an event boundary (see invariants.py)."""
        invariants.check(self)


def _within(job: SimJob) -> str:
    """A gang kept within one block fails apart from the same demand anywhere (its own memo key)."""
    return "" if job.within_block is None else ("@block!" if job.within_block else "@block")
