"""Migration that unblocks a waiting job, as KAI-Scheduler's consolidation does: move the few jobs that stand
on the GPUs a waiting job needs whole to other GPUs, so that it can start, all moves or none.

Rules: only for a job that needs whole GPUs (a full-size profile, or ``gpus: n`` on one node) and fits nowhere
now; at most ``max_moves`` moves for it; only migratable jobs that were never moved (each job moves at most
once), never a latency-sensitive one; a job ending within ``min_left_s`` is waited for rather than moved (its
GPU frees about as soon), so is a GPU whose jobs all end within it. A gang's GPUs are the ``n`` on one node
that the fewest moves empty. Each moved job goes to a start on another GPU, outside the ones being emptied,
free of busy slices and of the instances already planned there, the one that raises that GPU's FragCost least.
For a whole-GPU job, GPUs with no job are never targets (they would host the waiting job themselves); for a
gang they are, after every GPU with a job: a whole-GPU job on the gang's node can go nowhere else. Among the
choices: fewest moves, then the least compute moved, then snapshot order. A gang member never moves alone.

``free_after_moves`` tells when each GPU would free if a node's last few jobs were moved rather than waited
for: a reservation drains a node until then, and the moves finish the job.

Pure: the snapshot carries the instances' expected ends; the clock is handed in.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import msgspec
import numpy as np
import numpy.typing as npt

from shared.mig.occupancy import span
from shared.mig.tables import tables_for
from shared.policy.migration.moves import Move
from shared.policy.placement.decision import JobRequest
from shared.policy.placement.gang import spans_nodes
from shared.policy.request import full_profile, resolve_profile
from shared.policy.reservation import whole_gpus
from shared.policy.snapshot import ClusterSnapshot, InstanceView


class UnblockParams(msgspec.Struct, frozen=True, kw_only=True):
    max_moves: int = 2
    """Moves one blocked job may cost."""
    min_left_s: float = 300.0
    """A job expected to end within this is waited for, not moved."""


class Clearing(msgspec.Struct, frozen=True, kw_only=True):
    """The GPUs emptied for a waiting job and the moves that empty them."""

    gpus: tuple[str, ...]
    moves: tuple[Move, ...]


def _movable(inst: InstanceView, now: float, params: UnblockParams, gangs: Collection[str]) -> bool:
    return (inst.migratable and not inst.latency_sensitive and math.isinf(inst.last_moved_at)
            and inst.expected_end - now > params.min_left_s and inst.job_id not in gangs)


def _gangs(snap: ClusterSnapshot) -> frozenset[str]:
    """Jobs with more than one instance: a gang member never moves alone."""
    seen: set[str] = set()
    twice: set[str] = set()
    for gpu in snap.gpus:
        for i in gpu.instances:
            if i.job_id is not None:
                (twice if i.job_id in seen else seen).add(i.job_id)
    return frozenset(twice)


def plan_unblock(
    snap: ClusterSnapshot, job: JobRequest, now: float, params: UnblockParams | None = None
) -> tuple[Move, ...]:
    """The moves that empty the GPUs ``job`` needs (empty: none found, or the job does not need whole GPUs)."""
    found = plan_clearing(snap, job, now, params)
    return () if found is None else found.moves


def plan_clearing(
    snap: ClusterSnapshot, job: JobRequest, now: float, params: UnblockParams | None = None
) -> Clearing | None:
    """The GPUs to empty for ``job`` and the moves that do it; None when no moves would let it start."""
    params = params or UnblockParams()
    need = whole_gpus(snap.model_list, job.demand)
    if job.demand.kind == "mig" and need:
        return _clear_one(snap, job, now, params, _gangs(snap))
    if job.demand.kind == "gpus" and need > 1 and not spans_nodes(snap, job.demand):
        return _clear_node(snap, need, now, params, _gangs(snap))
    return None


def _cost(
    snap: ClusterSnapshot, p: int, now: float, params: UnblockParams, gangs: Collection[str]
) -> tuple[int, int] | None:
    """(moves, compute moved) to empty usable GPU ``p`` for a full-size member; None when it cannot be."""
    gpu = snap.gpus[p]
    if not snap.ok[p]:
        return None
    busy = [i for i in gpu.instances if i.job_id is not None]
    if not busy:
        return 0, 0
    if not gpu.mig or len(busy) > params.max_moves or not all(_movable(i, now, params, gangs) for i in busy):
        return None
    return len(busy), sum(i.compute for i in busy)


def _clear_one(
    snap: ClusterSnapshot, job: JobRequest, now: float, params: UnblockParams, gangs: Collection[str]
) -> Clearing | None:
    best: tuple[tuple[int, int, int], Clearing] | None = None
    for p, src in enumerate(snap.gpus):
        if not src.busy_mask:
            continue
        model = snap.geometry.model(src.model)
        prof = resolve_profile(job.demand, model)
        if prof is None or prof.memory_slices != full_profile(model).memory_slices:
            continue
        cost = _cost(snap, p, now, params, gangs)
        if cost is None:
            continue
        moves = _relocate(snap, (p,))
        if moves is None:
            continue
        key = (cost[0], cost[1], p)
        if best is None or key < best[0]:
            best = (key, Clearing(gpus=(src.id,), moves=moves))
    return None if best is None else best[1]


def _clear_node(
    snap: ClusterSnapshot, need: int, now: float, params: UnblockParams, gangs: Collection[str]
) -> Clearing | None:
    """The ``need`` GPUs of one node that the fewest moves empty (at least one move: a node with ``need``
    empty GPUs would host the gang without any)."""
    by_node: dict[int, list[tuple[int, int, int]]] = {}
    nodes = snap.node_idx
    for p in range(len(snap)):
        cost = _cost(snap, p, now, params, gangs)
        if cost is not None:
            by_node.setdefault(int(nodes[p]), []).append((*cost, p))
    best: tuple[tuple[int, int, int], Clearing] | None = None
    ranked = [sorted(cands)[:need] for cands in by_node.values() if len(cands) >= need]
    if any(sum(c[0] for c in chosen) == 0 for chosen in ranked):
        return None
    for chosen in ranked:
        moves_n = sum(c[0] for c in chosen)
        if moves_n > params.max_moves:
            continue
        key = (moves_n, sum(c[1] for c in chosen), min(c[2] for c in chosen))
        if best is not None and key >= best[0]:
            continue
        pos = tuple(sorted(c[2] for c in chosen))
        moves = _relocate(snap, pos, to_empty=True)
        if moves is not None:
            best = (key, Clearing(gpus=tuple(snap.gpus[q].id for q in pos), moves=moves))
    return None if best is None else best[1]


def _relocate(snap: ClusterSnapshot, sources: Sequence[int], to_empty: bool = False) -> tuple[Move, ...] | None:
    """A target for every busy instance on the ``sources`` positions, on other busy GPUs (``to_empty``: on
    empty ones too, after every busy one), or None."""
    planned: dict[int, int] = {}  # position -> slices taken by moves planned there
    planned_gone: dict[int, set[str]] = {}  # position -> idle instances an earlier move there destroys
    out: list[Move] = []
    left = {p: snap.gpus[p].busy_mask for p in sources}
    busy = [(p, i) for p in sources for i in snap.gpus[p].instances if i.job_id is not None]
    for p, inst in sorted(busy, key=lambda b: -b[1].size):  # the largest first: they have the fewest places
        src = snap.gpus[p]
        found: tuple[bool, float, int, int] | None = None
        for q, dst in enumerate(snap.gpus):
            if q in left or not snap.ok[q] or dst.model != src.model:
                continue
            empty = not (dst.busy_mask | planned.get(q, 0))
            if empty and not to_empty:
                continue
            model = snap.geometry.model(dst.model)
            prof = model.profile(inst.profile)
            taken = dst.busy_mask | planned.get(q, 0)
            tables = tables_for(model)
            for s in prof.placements:
                pm = span(prof.memory_slices, s)
                if taken & pm:
                    continue
                rise = tables.cost(taken | pm) - tables.cost(taken)
                if found is None or (empty, rise, q, s) < found:
                    found = (empty, rise, q, s)
        if found is None:
            return None
        _, _, q, s = found
        dst = snap.gpus[q]
        pm = span(inst.size, s)
        gone = planned_gone.setdefault(q, set())
        destroy = tuple(i.id for i in dst.instances if i.job_id is None and i.mask & pm and i.id not in gone)
        gone.update(destroy)
        planned[q] = planned.get(q, 0) | pm
        before = left[p]
        left[p] &= ~inst.mask
        src_tables = tables_for(snap.geometry.model(src.model))
        dst_tables = tables_for(snap.geometry.model(dst.model))
        out.append(Move(
            job_id=inst.job_id or "", kind="inter", src_gpu=src.id, src_instance=inst.id, src_profile=inst.profile,
            src_start=inst.start, dst_gpu=dst.id, dst_profile=inst.profile, dst_start=s, dst_size=inst.size,
            destroy=destroy,
            frag_src_before=src_tables.cost(before), frag_src_after=src_tables.cost(left[p]),
            frag_dst_before=dst_tables.cost(dst.busy_mask), frag_dst_after=dst_tables.cost(dst.busy_mask | pm),
            expected_change=src_tables.cost(left[p]) - src_tables.cost(before),
            reason=f"unblocks a whole GPU on {src.id} for a waiting job",
        ))
    return tuple(out)


def free_after_moves(snap: ClusterSnapshot, now: float, params: UnblockParams | None = None) -> npt.NDArray[np.float64]:
    """Per GPU: when it is expected free if, on each node, the ``max_moves`` jobs expected to end last are
    moved away instead of waited for (only while each of them could be moved: ``plan_clearing``'s rule; a job
    with no expected end is never waited for, so a node running one that cannot move never frees)."""
    params = params or UnblockParams()
    gangs = _gangs(snap)
    free = np.maximum(np.asarray(snap.ends, dtype=np.float64), now)
    nodes = snap.node_idx
    last: dict[int, list[tuple[float, int, bool]]] = {}
    for p, gpu in enumerate(snap.gpus):
        if not gpu.busy_mask:
            continue
        for i in gpu.instances:
            if i.job_id is not None:
                movable = gpu.mig and _movable(i, now, params, gangs)
                last.setdefault(int(nodes[p]), []).append((i.expected_end, p, movable))
    for jobs in last.values():
        jobs.sort(key=lambda j: -j[0])
        dropped = 0
        while dropped < min(params.max_moves, len(jobs)) and jobs[dropped][2]:
            dropped += 1
        if not dropped:
            continue
        touched = {p for _, p, _ in jobs[:dropped]}
        for p in touched:
            free[p] = now
        for end, p, _ in jobs[dropped:]:
            if p in touched:
                free[p] = max(free[p], end)
    return free
