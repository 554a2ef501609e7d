"""Migration that unblocks a waiting job, as KAI-Scheduler's consolidation does: move the few jobs that stand
on one GPU to other GPUs so that a job needing that whole GPU can start, all moves or none.

Rules: only for a job that needs one whole GPU (a full-size profile) and fits nowhere now; at most
``max_moves`` moves for it; only migratable jobs that were never moved (each job moves at most once), never a
latency-sensitive one; a job ending within ``min_left_s`` is waited for rather than moved (its GPU frees about
as soon), so is a GPU whose jobs all end within it. Each moved job goes to a start on another GPU free of busy
slices and of the instances already planned there, the one that raises that GPU's FragCost least; GPUs with no
job are never targets (they would host the waiting job themselves). Among the GPUs that can be emptied this way:
fewest moves, then the least compute moved, then snapshot order.

Pure: the snapshot carries the instances' expected ends; the clock is handed in.
"""

from __future__ import annotations

import math

import msgspec

from shared.mig.occupancy import span
from shared.mig.tables import tables_for
from shared.policy.migration.moves import Move
from shared.policy.placement.decision import JobRequest
from shared.policy.request import full_profile, resolve_profile
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView


class UnblockParams(msgspec.Struct, frozen=True, kw_only=True):
    max_moves: int = 2
    """Moves one blocked job may cost."""
    min_left_s: float = 300.0
    """A job expected to end within this is waited for, not moved."""


def needs_whole_gpu(snap: ClusterSnapshot, job: JobRequest) -> bool:
    if job.demand.kind != "mig":
        return False
    for model in snap.model_list:
        prof = resolve_profile(job.demand, model)
        if prof is not None and prof.memory_slices == full_profile(model).memory_slices:
            return True
    return False


def _movable(inst: InstanceView, now: float, params: UnblockParams) -> bool:
    return (inst.migratable and not inst.latency_sensitive and math.isinf(inst.last_moved_at)
            and inst.expected_end - now > params.min_left_s)


def plan_unblock(
    snap: ClusterSnapshot, job: JobRequest, now: float, params: UnblockParams | None = None
) -> tuple[Move, ...]:
    """The moves that empty one GPU for ``job`` (empty: none found, or the job does not need a whole GPU)."""
    params = params or UnblockParams()
    if not needs_whole_gpu(snap, job):
        return ()
    ok = snap.ok
    best: tuple[tuple[int, int, int], tuple[Move, ...]] | None = None
    for p, src in enumerate(snap.gpus):
        if not ok[p] or not src.busy_mask:
            continue
        model = snap.geometry.model(src.model)
        prof = resolve_profile(job.demand, model)
        if prof is None or prof.memory_slices != full_profile(model).memory_slices:
            continue
        busy = [i for i in src.instances if i.job_id is not None]
        if len(busy) > params.max_moves or not all(_movable(i, now, params) for i in busy):
            continue
        moves = _relocate(snap, p, src, busy)
        if moves is None:
            continue
        key = (len(moves), sum(i.compute for i in busy), p)
        if best is None or key < best[0]:
            best = (key, moves)
    return () if best is None else best[1]


def _relocate(
    snap: ClusterSnapshot, src_pos: int, src: GpuView, busy: list[InstanceView]
) -> tuple[Move, ...] | None:
    """A target for every busy instance of ``src`` on other busy GPUs, or None."""
    planned: dict[int, int] = {}  # position -> slices taken by moves planned there
    planned_gone: dict[int, set[str]] = {}  # position -> idle instances an earlier move there destroys
    out: list[Move] = []
    src_tables = tables_for(snap.geometry.model(src.model))
    left = src.busy_mask
    for inst in sorted(busy, key=lambda i: -i.size):  # the largest first: they have the fewest places
        found: tuple[float, int, int] | None = None
        for q, dst in enumerate(snap.gpus):
            if q == src_pos or not snap.ok[q] or not dst.busy_mask or dst.model != src.model:
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
                if found is None or (rise, q, s) < found:
                    found = (rise, q, s)
        if found is None:
            return None
        _, q, s = found
        dst = snap.gpus[q]
        pm = span(inst.size, s)
        gone = planned_gone.setdefault(q, set())
        destroy = tuple(i.id for i in dst.instances if i.job_id is None and i.mask & pm and i.id not in gone)
        gone.update(destroy)
        planned[q] = planned.get(q, 0) | pm
        before = left
        left &= ~inst.mask
        dst_tables = tables_for(snap.geometry.model(dst.model))
        out.append(Move(
            job_id=inst.job_id or "", kind="inter", src_gpu=src.id, src_instance=inst.id, src_profile=inst.profile,
            src_start=inst.start, dst_gpu=dst.id, dst_profile=inst.profile, dst_start=s, dst_size=inst.size,
            destroy=destroy,
            frag_src_before=src_tables.cost(before), frag_src_after=src_tables.cost(left),
            frag_dst_before=dst_tables.cost(dst.busy_mask), frag_dst_after=dst_tables.cost(dst.busy_mask | pm),
            expected_change=src_tables.cost(left) - src_tables.cost(before),
            reason=f"unblocks a whole GPU on {src.id} for a waiting job",
        ))
    return tuple(out)
