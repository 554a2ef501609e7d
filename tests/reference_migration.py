"""The migration planner's pull as an exhaustive scan: the reference its best-first search is held to.

``sources`` lists every movable job on a Busy GPU whose removal lowers that GPU's FragCost, best drop first,
reading every GPU (untouched ones from the snapshot, changed ones from the plan's virtual state);
``exhaustive_pull`` takes the first of them that the target may host, as ``PullSearch.best_pull`` must.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shared.policy.migration.moves import SourceJob
from shared.policy.migration.plan import _Plan
from shared.policy.migration.search import VirtualGpu, tables_of
from shared.policy.snapshot import InstanceView


def sources(plan: _Plan) -> list[SourceJob]:
    snap = plan.snap
    load_q = np.rint(snap.used.astype(np.float64) * 1000.0 / np.maximum(snap.compute, 1))
    ok = (load_q >= plan.t_q) & np.asarray(snap.mig, dtype=bool) & np.asarray(snap.healthy, dtype=bool)
    found: list[SourceJob] = []
    touched = plan._changed
    insts: Sequence[InstanceView]
    for pos in sorted(set(np.flatnonzero(ok).tolist()) | touched.keys()):
        g = touched.get(pos)
        if g is not None:
            if not plan.busy_tier(g):
                continue
            insts, busy, lq, table = g.insts, g.busy_mask, g.load_q(), g.tables.fragcost_q
        else:
            view = snap.gpus[pos]
            insts, busy, lq = view.instances, view.busy_mask, int(load_q[pos])
            table = tables_of(plan.model_at(pos)).fragcost_q
        before = int(table[busy])
        for inst in insts:
            if not plan.may_move(inst, inter=True):
                continue
            change = int(table[busy & ~inst.mask]) - before
            if change < 0:
                found.append(((change, -lq, pos, inst.start), snap.gpus[pos].id, inst))
    found.sort(key=lambda f: f[0])
    return found


def exhaustive_pull(plan: _Plan, t: VirtualGpu, why: str) -> bool:
    """``_Plan.pull_into`` with the full source list scanned in order."""
    if plan.full() or plan.busy_tier(t):
        return False
    if not plan.params.pull_into_empty and t.busy_mask == 0:
        return False
    for _, src_id, inst in sources(plan):
        dst = plan._dst_for(t, src_id, inst)
        if dst is not None:
            plan.apply_inter(plan.gpu(src_id), inst, t, dst[0], dst[1], why)
            return True
    return False
