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

from shared.policy.placement import CannotPlace, Slot
from shared.policy.request import resolve_profile
from shared.sim.jobs import SimJob

if TYPE_CHECKING:
    from shared.sim.engine import Simulator


def schedule(sim: Simulator) -> None:
    """One bounded pass over the queue (``backfill_depth`` entries). A demand that failed since the last time
    room was freed fails again, so it is skipped."""
    if not sim.queue:
        return
    placed: list[tuple[int, float, int]] = []
    version = sim.version  # placements only consume room (nothing is freed): constant during a pass
    failed, memos, jobs, placer = sim.failed, sim._memo_keys, sim.jobs, sim.placer
    for key in sim.queue[: sim.cfg.backfill_depth]:
        i = key[2]
        memo = memos[i]
        seen = failed.get(memo)
        job = jobs[i]
        if seen is not None:
            if seen == version:  # nothing freed since it failed (may_fit_since would say so, slower)
                continue
            if not may_fit_since(sim, job, seen):
                failed[memo] = version
                continue
        if placer is not None and placer.handles(job.demand):
            got = placer.place(job.demand)
            if got is None:
                failed[memo] = version
                continue
            slots: tuple[Slot, ...] = got
        else:
            decision = sim.policy(sim.cluster.snapshot(), job.request())
            if isinstance(decision, CannotPlace):
                failed[memo] = version
                continue
            slots = decision.slots
        placed.append(key)
        sim._start(i, slots)
    for key in placed:
        del sim.queue[bisect.bisect_left(sim.queue, key)]


def may_fit_since(sim: Simulator, job: SimJob, version: int) -> bool:
    """Could ``job``, which failed at ``version``, fit now? Only GPUs freed since then have more room, so only
    they can host it; this is a necessary condition (slices not busy, ignoring idle instances and max counts),
    so skipping the policy call when it is false never misses a placement."""
    changed = sim.freed[version:]
    if len(changed) > 64:
        return True
    placer = sim.placer
    cluster = sim.cluster
    for gid in set(changed):
        gpu = cluster.views[gid]
        if job.demand.kind == "gpus":  # a gang needs n empty GPUs on one node
            if placer is not None and placer.handles(job.demand):
                # the index counts them (empty, MIG and healthy: what the balancer's gang rule needs)
                if placer.empty_on(gpu.node) >= job.gpus:
                    return True
                continue
            node = cluster.node_gpus[gpu.node]
            if gpu.busy_mask == 0 and sum(cluster.gpu(g).busy_mask == 0 for g in node) >= job.gpus:
                return True
            continue
        if job.demand.kind != "mig":
            return True
        model = cluster.models[gid]
        key = (job.shape, model.name)
        masks = sim._profiles.get(key)
        if masks is None:
            prof = resolve_profile(job.demand, model)
            masks = sim._profiles[key] = () if prof is None else tuple(
                ((1 << prof.memory_slices) - 1) << s for s in prof.placements)
        busy = gpu.busy_mask
        for m in masks:
            if not busy & m:
                return True
    return False
