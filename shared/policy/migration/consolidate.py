"""Consolidation: empty a lightly used GPU by moving its few jobs onto GPUs that already hold jobs.

The seeds' inter-GPU move pulls a job *into* a Lazy GPU, which spreads work over empty GPUs. On real traces
most requests are whole GPUs (openb: 58-79 % of jobs), and an empty GPU is the only place such a job can
start,
so the opposite move pays: when a job leaves a Lazy GPU that keeps a few small jobs, move all of them onto
other non-empty GPUs (the least FragCost increase there, as the ``delta`` balancer ranks), so the GPU becomes
empty. All or nothing: if one job has no room elsewhere, nothing moves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import numpy as np
import numpy.typing as npt

from shared.mig.geometry import Profile
from shared.mig.occupancy import span
from shared.policy.migration.search import VirtualGpu, shape_target
from shared.policy.placement.balancer_keys import _UNFIT, _create_part

if TYPE_CHECKING:
    from shared.policy.migration.plan import _Plan


def consolidate(plan: _Plan, g: VirtualGpu, why: str) -> bool:
    """Plan moves that leave ``g`` with no job; False (and no moves) when that is not possible."""
    jobs = [i for i in g.insts if i.busy]
    if not jobs or len(plan.moves) + len(jobs) > plan.params.max_moves:
        return False
    if not all(plan.may_move(i, inter=True) for i in jobs):
        return False
    snap = plan.snap
    # targets: usable GPUs other than g that already run a job, as the snapshot shows them ...
    base_ok = np.asarray(snap.ok) & (np.asarray(snap.busy) != 0)
    base_ok[g.pos] = False
    # largest first: they have the fewest places to go
    for inst in sorted(jobs, key=lambda i: (-i.size, i.start)):
        src_prof = g.model.profile(inst.profile)
        found = _best_target(plan, base_ok, src_prof, g)
        if found is None:
            return False  # all or nothing: the caller drops this plan
        t, prof, start = found
        plan.apply_inter(g, inst, t, prof, start, why)
        plan.moves[-1] = msgspec.structs.replace(
            plan.moves[-1],
            reason=f"{why}: {inst.profile} from {g.id} onto {t.id} {prof.name}@{start}, emptying {g.id}",
        )
    return True


def _best_target(
    plan: _Plan, base_ok: npt.NDArray[np.bool_], src: Profile, g: VirtualGpu
) -> tuple[VirtualGpu, Profile, int] | None:
    """The target with the least FragCost increase, then the most used (packing), then listed first.

    Untouched GPUs are ranked on the columns with the balancer's ``delta`` create table (same start rule as
    ``dst_placement``: lowest FragCost after, fewest idle slices destroyed, highest start); GPUs this plan
    already changed are scored on their virtual state."""
    snap = plan.snap
    touched = plan._changed
    best: tuple[tuple[int, int, int], VirtualGpu, Profile, int] | None = None
    for t in touched.values():
        if t.pos == g.pos or not t.busy_mask or not plan.usable(t.id):
            continue
        got = _score(plan, t, src)
        if got is not None and (best is None or got[0] < best[0]):
            best = (got[0], t, got[1], got[2])
    used = np.asarray(snap.used, dtype=np.int64)
    for k, m in enumerate(snap.model_list):
        prof = shape_target(src, m)
        if prof is None:
            continue
        part = _create_part(m, prof.name, True)[np.asarray(snap.pair) & 0xFFFF]
        on = base_ok & (part < _UNFIT)
        if len(snap.model_list) > 1:
            on &= np.asarray(snap.model_idx) == k
        if touched:
            on[list(touched)] = False
        pos = np.flatnonzero(on)
        if not pos.size:
            continue
        inc = (part[pos] >> 22) & ((1 << 31) - 1)
        for p in pos[np.lexsort((pos, -used[pos], inc))].tolist():
            if best is not None and (int(inc[np.searchsorted(pos, p)]), -int(used[p]), p) > best[0]:
                break
            t = plan.peek(p)
            got = _score(plan, t, src)
            if got is not None:
                if best is None or got[0] < best[0]:
                    best = (got[0], t, got[1], got[2])
                break
    return None if best is None else best[1:]


def _score(plan: _Plan, t: VirtualGpu, src: Profile) -> tuple[tuple[int, int, int], Profile, int] | None:
    placed = plan.dst_placement(t, src)
    if placed is None:
        return None
    prof, start = placed
    pm = span(prof.memory_slices, start)
    return (t.cost_q(t.busy_mask | pm) - t.cost_q(t.busy_mask), -t.used, t.pos), prof, start
