"""The seeds' migration planner: reactive and periodic defragmentation as a list of planned moves.

On a **Busy** GPU (load >= threshold) it plans intra-GPU moves: the move that lowers the GPU's FragCost most,
then again on the updated (virtual) state, while a move still lowers it. On a **Lazy** GPU it pulls one job
from a Busy GPU with a higher load: the job whose removal lowers that source's FragCost most, placed at the
target's best placement (lowest FragCost after), provided the target does not end up more loaded than the
source.

Moves are make-before-break (start on the destination, then stop the source and destroy its instance), so the
destination slices must be free while the source still holds its own: an intra move never overlaps its source.
Idle instances in the destination's way may be destroyed; each move lists them. Moves are ordered: each
assumes the previous ones have completed. A job moves at most once per plan; ``migratable``, the per-job
cooldown and "no inter-GPU move for latency-sensitive jobs" are honoured, and a plan has at most ``max_moves``
moves.

Scores use FragCost over busy instances (idle ones are reclaimable), quantised so that equal costs tie
exactly. Tie-breaks, for reproducibility: intra: larger drop, fewer idle slices destroyed, lower source start,
higher destination start, job id; inter: larger drop at the source, higher source load, source listed first,
lower source start; then, on the target, lowest FragCost after, fewest idle slices destroyed, highest start.
"""

from __future__ import annotations

import heapq

import numpy as np
import numpy.typing as npt

from shared.policy.migration.consolidate import consolidate
from shared.policy.migration.memos import PlannerMemos
from shared.policy.migration.moves import IntraMove, MigrationParams, Move, SourceJob
from shared.policy.migration.plan import _Plan
from shared.policy.migration.pull_index import PullIndex
from shared.policy.snapshot import ClusterSnapshot

__all__ = [
    "IntraMove", "MigrationParams", "Move", "PlannerMemos", "SourceJob", "_Plan", "plan_after_exit", "plan_defrag",
]


def plan_after_exit(
    snap: ClusterSnapshot, gpu_id: str, now: float, params: MigrationParams, *, pulls: PullIndex | None = None,
    memos: PlannerMemos | None = None,
) -> tuple[Move, ...]:
    """Moves to make after a job left ``gpu_id`` (the snapshot already shows it gone).

    Busy GPU: intra-GPU moves, best first, while they lower its FragCost. Lazy GPU: pull one job from a Busy
    GPU with a higher load. An unknown, unhealthy or non-MIG GPU gets no moves. ``pulls``: an index of pull
    sources kept by the caller (the simulator), synchronised with ``snap``; the same moves, found sooner.
    ``memos``: what the caller keeps across plans (default: the pull index's, else this plan's own).
    """
    plan = _Plan(snap, now, params, pulls, memos)
    if params.max_moves <= 0 or not plan.usable(gpu_id):
        return ()
    g = plan.gpu(gpu_id)
    if plan.busy_tier(g):
        if params.intra:
            plan.intra_on(g, "after exit, busy GPU")
    elif params.consolidate and g.busy_mask and consolidate(plan, g, "after exit, consolidate"):
        return tuple(plan.moves)
    else:
        if params.consolidate and g.busy_mask:
            # a failed consolidation leaves nothing behind, also when no pull follows (it may have planned
            # some of the GPU's jobs before finding no room for another: all or nothing)
            plan = _Plan(snap, now, params, pulls, plan.memos)
            g = plan.gpu(gpu_id)
        if params.inter:
            plan.pull_into(g, "after exit, lazy GPU")
    return tuple(plan.moves)


def plan_defrag(
    snap: ClusterSnapshot, now: float, params: MigrationParams, *, pulls: PullIndex | None = None,
    memos: PlannerMemos | None = None,
) -> tuple[Move, ...]:
    """The periodic defragmentation over all GPUs, at most ``params.max_moves`` moves in all.

    First intra moves on Busy GPUs, always the largest FragCost drop in the cluster next; then one pull into
    each Lazy GPU, least loaded first (snapshot order breaks ties). GPUs are searched best bound first, so a
    tick over thousands of GPUs looks at few of them closely. ``pulls`` and ``memos`` as for
    ``plan_after_exit``.
    """
    plan = _Plan(snap, now, params, pulls, memos)
    if params.max_moves <= 0 or len(snap) == 0:
        return ()
    load_q, busy_ok, _, intra_bound = plan.columns()
    if params.intra:
        heap = [(int(intra_bound[p]), int(p)) for p in np.flatnonzero(busy_ok & (intra_bound < 0))]
        heapq.heapify(heap)
        found: dict[int, IntraMove | None] = {}
        while not plan.full():
            cur = min(((f[0], p) for p, f in found.items() if f is not None), default=None)
            # a GPU whose bound cannot beat the best move found so far need not be looked at
            while heap and (cur is None or heap[0][0] <= cur[0][0]):
                _, p = heapq.heappop(heap)
                f = found[p] = plan.best_intra(plan.peek(p))
                if f is not None and (cur is None or (f[0], p) < cur):
                    cur = (f[0], p)
            if cur is None:
                break
            p = cur[1]
            g = plan.peek(p)
            move = found[p]
            assert move is not None
            plan.apply_intra(g, move, "defragmentation, busy GPU")
            found[p] = plan.best_intra(g)
    if params.inter and not plan.full():
        usable = np.asarray(snap.mig, dtype=bool) & np.asarray(snap.healthy, dtype=bool)
        lazy = usable & (load_q < plan.t_q)
        for p in list(plan._changed):
            lazy[p] = usable[p] and not plan.busy_tier(plan._changed[p])
        order = np.flatnonzero(lazy)
        loads = np.asarray(load_q, dtype=np.int64)[order]
        for p, g in plan._changed.items():
            k = int(np.searchsorted(order, p))
            if k < order.size and int(order[k]) == p:
                loads[k] = g.load_q()
        targets = order[np.lexsort((order, loads))] if order.size else order
        failed: tuple[int, set[object]] = (len(plan.moves), set())
        # an untouched GPU's instance set is given by its columns, so that skipping a GPU identical to one
        # that failed is a look-up of one integer (its signature), not a walk over its instances
        exists: tuple[int, bool] = (-1, False)
        for p, sid in zip(targets.tolist(), _signatures(snap, targets), strict=True):
            if exists[0] != len(plan.moves):  # sources change only when a move is planned
                exists = (len(plan.moves), plan.sources_exist())
            if plan.full() or not exists[1]:
                break
            if failed[0] != len(plan.moves):
                failed = (len(plan.moves), set())
            if p in plan._changed:
                t = plan.peek(p)
                sig: object = (t.model.name, t.busy_mask,
                               tuple((i.profile, i.start, i.busy) for i in t.insts))
            else:
                sig = sid
            if sig in failed[1]:
                continue  # an identical GPU found nothing to pull since the last move
            t = plan.peek(p)
            if not plan.pull_into(t, "defragmentation, lazy GPU"):
                failed[1].add(sig)
    return tuple(plan.moves)


def _signatures(snap: ClusterSnapshot, positions: npt.NDArray[np.intp]) -> list[int]:
    """Per position: an integer equal for two GPUs exactly when their (``pair``, ``busy_starts``,
    ``idle_starts``) rows are, i.e. when they hold the same instances (an int never equals the tuple that
    identifies a GPU the plan changed)."""
    if not positions.size:
        return []
    pair = np.ascontiguousarray(np.asarray(snap.pair, dtype=np.int64)[positions]).view(np.uint8)
    key = np.ascontiguousarray(np.concatenate(
        [pair.reshape(positions.size, 8), np.asarray(snap.busy_starts)[positions],
         np.asarray(snap.idle_starts)[positions]], axis=1))
    rows = key.view(np.dtype((np.void, key.shape[1]))).ravel()
    _, inverse = np.unique(rows, return_inverse=True)
    return [int(v) for v in inverse.ravel().tolist()]
