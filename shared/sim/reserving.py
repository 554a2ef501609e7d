"""The queue pass with reservations (``shared.policy.reservation``): the plain pass of ``backfill`` plus GPUs
held for the oldest large jobs that do not fit.

Reservations are planned again at every pass, in queue order, from the expected ends of the running jobs (the
snapshot's ``ends``: the start of each plus its duration hint), as a backfilling batch scheduler re-plans
each cycle: a job that
overran its hint pushes its GPU's expected free time to now, and a reservation whose job was placed or timed
out is simply not planned again. While a reservation holds GPUs, a later job in the pass sees them as
unusable unless its hint says it ends before the reservation's start. The GPU-seconds held GPUs spend with
free slices are added up in ``sim.reserved_idle_s`` (reported as ``reserved_idle_gpu_h``).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from shared.policy.hold_pass import HoldPass
from shared.policy.migration.unblock import free_after_moves, plan_clearing
from shared.policy.placement.decision import CannotPlace, Slot
from shared.policy.placement.long_gangs import waits
from shared.policy.reservation import Reservation, plan, whole_gpus
from shared.policy.snapshot import ClusterSnapshot
from shared.sim.backfill import may_fit_since
from shared.sim.errors import InvariantError
from shared.sim.jobs import QUEUED
from shared.sim.moves import try_move

if TYPE_CHECKING:
    from shared.sim.run import SimRun


def schedule(sim: SimRun) -> None:
    """One bounded pass over the queue in priority-then-age order, holding GPUs for large jobs."""
    if not sim.queue and not sim.reservations and not sim.pinned:
        sim.held_since = sim.now  # nothing waits and nothing was held: a pass would plan nothing (most passes)
        return
    account(sim)
    for i in [i for i in sim.pinned if sim.state[i] != QUEUED]:
        del sim.pinned[i]  # its job timed out (or was placed elsewhere)
    holds = PassHolds(sim)
    if not sim.queue:
        holds.settle()
        return
    placed: list[tuple[int, float, int]] = []
    version = sim.version
    failed, memos, jobs, placer = sim.failed, sim.memo_keys, sim.jobs, sim.placer
    now = sim.now
    for key in sim.queue[: sim.cfg.backfill_depth]:
        i = key[2]
        job = jobs[i]
        h = sim.hint(i)
        blocked = holds.blocking(h)
        memo = memos[i]
        remember = i not in sim.long_gangs  # see backfill
        seen = failed.get(memo) if remember else None
        skip = seen is not None and (seen == version or not _may_fit(sim, i, seen))
        slots: tuple[Slot, ...] | None = None
        if not skip:
            if not blocked and placer is not None and job.within_block is None and placer.handles(job.demand):
                slots = placer.place(job.demand, h, now, job.arrival)
            else:
                snap = sim.cluster.snapshot()
                if blocked:
                    snap = snap.without(blocked)
                decision = sim.policy(snap, job.request(h, now, sim.blocks))
                slots = None if isinstance(decision, CannotPlace) else decision.slots
            if slots is None and not blocked and remember:
                failed[memo] = version
        if slots is not None:
            placed.append(key)
            sim.pinned.pop(i, None)
            sim.start(i, slots)
            continue
        pin = sim.pinned.get(i)
        if pin is not None:  # its GPU is being emptied for it: held until the moves are done
            holds.add(pin)
            continue
        holds.consider(i, unblock=sim.unblocks)
    for key in placed:
        del sim.queue[bisect.bisect_left(sim.queue, key)]
    holds.settle()


class PassHolds:
    """The holds one queue pass plans (``shared.policy.hold_pass.HoldPass``), with the simulator's parts: the
    policy's long-gang rule, moves that empty a held GPU sooner, and the held slices counted idle."""

    def __init__(self, sim: SimRun) -> None:
        self.sim = sim
        self.holds = HoldPass(sim.reservation_params)

    def blocking(self, hint_s: float | None) -> set[str]:
        """The held GPUs a job of this hint may not use now (``may_use``)."""
        return self.holds.blocking(hint_s, self.sim.now)

    def add(self, r: Reservation) -> None:
        self.holds.add(r)

    def consider(self, i: int, unblock: bool = False) -> None:
        """A hold for job ``i``, which could not be placed, when one is due, the pass has room for it and the
        policy's long-gang rule does not keep the job waiting (``_kept_waiting``); ``unblock``: moves may empty
        its GPUs sooner (``_unblock``, ``_drain``)."""
        sim, job = self.sim, self.sim.jobs[i]
        need = whole_gpus(sim.cluster.model_list, job.demand)
        if not self.holds.wants(need, sim.now - job.arrival, need > sim.largest_node) or _kept_waiting(sim, i):
            return
        patience = job.patience if job.patience is not None else sim.cfg.patience_s
        within = job.within_block is not None and job.demand.kind == "gpus"
        r = self.holds.plan(sim.cluster.snapshot(), job.id, need, sim.now, job.arrival + patience,
                           sim.blocks if within else None, bool(job.within_block), job.demand.kind == "gpus")
        if unblock and job.within_block is None and (r is None or r.start - sim.now > sim.unblock_params.min_left_s):
            taken = self.holds.taken
            r = _unblock(sim, i, taken) or _drain(sim, i, sim.cluster.snapshot(), need, patience, taken, r)
        if r is not None:
            self.add(r)

    def settle(self) -> None:
        """The pass's holds are the reservations until the next pass (their idle slices counted from now)."""
        self.sim.reservations = self.holds.held
        self.sim.held_free = _held_free(self.sim, self.holds.held)


def _kept_waiting(sim: SimRun, i: int) -> bool:
    """Whether the policy's long-gang rule keeps job ``i`` waiting now: it gets no hold (it would not start on
    the held GPUs either)."""
    if i not in sim.long_gangs or sim.align is None:
        return False
    job = sim.jobs[i]
    snap = sim.cluster.snapshot()
    empty = int(np.count_nonzero(snap.ok & (np.asarray(snap.busy) == 0)))
    return waits(sim.align, job.demand.gpus, sim.hint(i), sim.now - job.arrival, empty, len(snap)) is not None


def _unblock(sim: SimRun, i: int, taken: set[str]) -> Reservation | None:
    """Start the moves that empty the GPUs job ``i`` needs (``shared.policy.migration.unblock``), all or none,
    and hold those GPUs for it; None when they cannot be emptied."""
    snap = sim.cluster.snapshot().without(taken)
    clearing = plan_clearing(snap, sim.jobs[i].request(sim.hint(i), sim.now), sim.now, sim.unblock_params)
    if clearing is None:
        return None
    for m in clearing.moves:  # independent moves (other jobs, other slices): all at once
        if try_move(sim, m) < 0:
            raise InvariantError(f"unblock move {m.job_id} -> {m.dst_gpu}@{m.dst_start} did not apply")
    pin = Reservation(job_id=sim.jobs[i].id, gpus=clearing.gpus, node=sim.cluster.gpu(clearing.gpus[0]).node,
                      start=sim.now, reason=f"being emptied by {len(clearing.moves)} move(s)")
    sim.pinned[i] = pin
    return pin


def _drain(sim: SimRun, i: int, snap: ClusterSnapshot, need: int, patience: float, taken: set[str],
           waited: Reservation | None) -> Reservation | None:
    """A hold on the GPUs that free soonest if each node's last few jobs are moved rather than waited for
    (``free_after_moves``), when that is sooner than ``waited``, the hold that waits for every job: it drains
    them, and once they are that far, ``_unblock`` moves the rest."""
    now = sim.now
    free = free_after_moves(snap, now, sim.unblock_params)
    r = plan(snap, sim.jobs[i].id, need, now, sim.jobs[i].arrival + patience, taken, free_at=free)
    if r is None or (waited is not None and r.start >= waited.start):
        return waited
    return msgspec.structs.replace(r, reason=f"{r.reason}, once its last jobs are moved")


def _may_fit(sim: SimRun, i: int, seen: int) -> bool:
    return may_fit_since(sim, sim.jobs[i], seen)


def _held_free(sim: SimRun, held: list[Reservation]) -> float:
    """Whole GPUs' worth of free memory slices on held GPUs."""
    total = 0.0
    views, models = sim.cluster.views, sim.cluster.models
    for r in held:
        for g in r.gpus:
            m = models[g].memory_slices
            total += (m - views[g].busy_mask.bit_count()) / m
    return total


def account(sim: SimRun) -> None:
    """Add the idle held GPU-seconds since the last pass."""
    sim.reserved_idle_s += sim.held_free * (sim.now - sim.held_since)
    sim.held_since = sim.now
