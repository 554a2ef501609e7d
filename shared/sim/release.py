"""Freeing an instance: the node registry's keep-or-destroy rule for the idle instance a job leaves, and a static
layout's restoration once its GPU is empty again."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.policy.retention import keeps_idle

if TYPE_CHECKING:
    from shared.sim.run import SimRun


def free(sim: SimRun, iid: str, job: int = -1) -> None:
    """Release an instance; keep it idle for reuse or destroy it (the node registry's adaptive rule)."""
    cluster = sim.cluster
    gid = cluster.where[iid]
    if job >= 0:
        sim.leave(job, gid)
    gpu = cluster.release(iid)
    sim.freed.append(gid)
    if not sim.spec.repartitions:
        restore_layout(sim, gid)
        return
    inst = gpu.instance(iid)
    assert inst is not None
    profile = inst.profile
    same = 0
    for other in gpu.instances:
        if other.job_id is None and other.profile == profile and other.id != iid:
            same += 1
    demand = sim.demand
    if not keeps_idle(profile, demand.counts(sim.now), same, sim.cfg.retention, demand.total):
        cluster.destroy(iid)
        sim.ops_ready(gid, 1)


def restore_layout(sim: SimRun, gid: str) -> None:
    """A static GPU that a whole-GPU job re-partitioned gets its layout back once it is empty."""
    layout = sim.layouts.get(gid)
    gpu = sim.cluster.gpu(gid)
    if (
        layout is None
        or gpu.busy_mask
        or tuple(sorted((i.profile, i.start) for i in gpu.instances)) == tuple(sorted(layout))
    ):
        return
    for inst in list(gpu.instances):
        sim.cluster.destroy(inst.id)
    for prof, start in layout:
        sim.cluster.add_idle(gid, prof, start, f"{gid}:{prof}@{start}:static{sim.version}")
        sim.cluster.reconfigurations += 1
    sim.ops_ready(gid, len(gpu.instances) + len(layout))
