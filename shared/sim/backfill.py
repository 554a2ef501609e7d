"""The queue pass: jobs in priority-then-age order, each placed if it fits now, later ones backfilling around
those that do not; a demand that failed is not asked again until room is freed where it could fit
(docs/simulator.md, "Queue").

MIG requests (and whole-GPU gangs while every GPU is in MIG mode) of a balancer-family policy are answered
by the simulator's ``PlacementIndex``, which chooses exactly what ``balancer.place`` chooses; every other
request goes to the policy with a snapshot, as the services ask it.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from shared.mig.geometry import GpuModel
from shared.policy.placement.decision import CannotPlace, Slot
from shared.policy.request import resolve_profile
from shared.sim.jobs import SimJob

if TYPE_CHECKING:
    from shared.sim.run import SimRun


def schedule(sim: SimRun) -> None:
    """One bounded pass over the queue (``backfill_depth`` entries). A demand that failed since the last time
    room was freed fails again, so it is skipped."""
    if not sim.queue:
        return
    placed: list[tuple[int, float, int]] = []
    version = sim.version  # placements only consume room (nothing is freed): constant during a pass
    failed, memos, jobs, placer = sim.failed, sim.memo_keys, sim.jobs, sim.placer
    for key in sim.queue[: sim.cfg.backfill_depth]:
        i = key[2]
        memo = memos[i]
        # a long gang may be kept waiting by the clock alone (long_gangs): its failures are not remembered
        remember = i not in sim.long_gangs
        seen = failed.get(memo) if remember else None
        if seen is not None:
            if seen == version:  # nothing freed since it failed (may_fit_since would say so, slower)
                continue
            if not may_fit_since(sim, jobs[i], seen):
                failed[memo] = version
                continue
        job = jobs[i]
        if placer is not None and job.within_block is None and placer.handles(job.demand):
            got = placer.place(job.demand, sim.hint(i), sim.now, job.arrival)
            if got is None:
                if remember:
                    failed[memo] = version
                continue
            slots: tuple[Slot, ...] = got
        else:
            decision = sim.policy(sim.cluster.snapshot(), job.request(sim.hint(i), sim.now, sim.blocks))
            if isinstance(decision, CannotPlace):
                if remember:
                    failed[memo] = version
                continue
            slots = decision.slots
        placed.append(key)
        sim.start(i, slots)
    for key in placed:
        del sim.queue[bisect.bisect_left(sim.queue, key)]


def may_fit_since(sim: SimRun, job: SimJob, version: int) -> bool:
    """Could ``job``, which failed at ``version``, fit now? Only GPUs freed since then have more room, so only
    they can host it; this is a necessary condition (slices not busy, ignoring idle instances and max counts),
    so skipping the policy call when it is false never misses a placement."""
    changed = sim.freed[version:]
    if len(changed) > 64:
        return True
    kind = job.demand.kind
    if kind == "gpus":
        return _gang_may_fit(sim, job, changed)
    if kind != "mig":
        return bool(changed)
    views, models = sim.cluster.views, sim.cluster.models
    last: GpuModel | None = None
    masks: tuple[int, ...] = ()
    for gid in set(changed):
        model = models[gid]
        if model is not last:  # most clusters have one model: its masks are looked up once per call
            last, masks = model, _masks(sim, job, model)
        busy = views[gid].busy_mask
        for m in masks:
            if not busy & m:
                return True
    return False


def _masks(sim: SimRun, job: SimJob, model: GpuModel) -> tuple[int, ...]:
    """The slice masks of the placements of the job's profile on ``model`` (none: no such profile)."""
    key = (job.shape, model.name)
    masks = sim.profiles.get(key)
    if masks is None:
        prof = resolve_profile(job.demand, model)
        masks = sim.profiles[key] = () if prof is None else tuple(
            ((1 << prof.memory_slices) - 1) << s for s in prof.placements)
    return masks


def _gang_may_fit(sim: SimRun, job: SimJob, changed: list[str]) -> bool:
    """``may_fit_since`` for a gang: it needs ``job.gpus`` empty GPUs on one node, or across nodes when it is
    bigger than every node."""
    placer = sim.placer
    cluster = sim.cluster
    views = cluster.views
    if job.gpus > sim.largest_node:
        return any(views[gid].busy_mask == 0 for gid in changed)
    # A node gains empty GPUs only through GPUs freed since the failure (``changed``) that are empty now: only
    # their nodes can hold the gang now, and a GPU freed but still busy need not be looked at (the rule of the
    # loop below too)
    if placer is not None and placer.handles(job.demand):
        # the index counts them (empty, MIG and healthy: what the balancer's gang rule needs)
        for gid in changed:
            gpu = views[gid]
            if gpu.busy_mask == 0 and placer.empty_on(gpu.node) >= job.gpus:
                return True
        return False
    for gid in set(changed):
        gpu = views[gid]
        node = cluster.node_gpus[gpu.node]
        if gpu.busy_mask == 0 and sum(cluster.gpu(g).busy_mask == 0 for g in node) >= job.gpus:
            return True
    return False
