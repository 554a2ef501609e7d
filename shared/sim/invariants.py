"""The simulator's invariants, checked after every event when ``SimConfig.check_invariants`` is on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.sim import cluster_check
from shared.sim.errors import InvariantError
from shared.sim.jobs import FUTURE, RUNNING, STARTING

if TYPE_CHECKING:
    from shared.sim.run import SimRun


def check(sim: SimRun) -> None:
    """Invariants at an event boundary: legal, non-overlapping instances; every live job holds exactly its
    instances; ended jobs hold none."""
    cluster_check.check(sim.cluster, sim.now)
    holders: dict[str, str] = {}
    for gid in sim.cluster.where.values():
        for inst in sim.cluster.gpu(gid).instances:
            if inst.job_id is not None:
                holders[inst.id] = inst.job_id
    expected: dict[str, str] = {}
    for i, st in enumerate(sim.state):
        if st in (STARTING, RUNNING):
            for iid in sim.insts[i]:
                expected[iid] = sim.jobs[i].id
            mv = sim.moving[i]
            if mv is not None:
                expected[mv.dst] = sim.jobs[i].id
    if holders != expected:
        extra = set(holders.items()) ^ set(expected.items())
        raise InvariantError(f"busy instances disagree with live jobs at t={sim.now}: {sorted(extra)[:4]}")
    if sim.out.ended + sim.out.live != sum(1 for s in sim.state if s != FUTURE):
        raise InvariantError("job accounting broken: ended + live != arrived")
