"""Reserved capacity: keep at least k GPUs able to host a full-size job free for bursts of large jobs.

A GPU is **free-full** when it is healthy and could take a full-size job now: a MIG GPU with no busy instance
(idle instances are reclaimable), or a plain GPU with no job and no share. A **full-size** request may use the
reserve: ``gpus: n``, or a MIG request that lands as its model's full profile (7g, 4g on A30). Any other
placement that would turn a free-full GPU into a used one while only k or fewer are free is refused with the
reason "reserved capacity"; ``place_reserving`` then tries the next candidate (the best placement on the GPUs
that are not reserved) before giving up.

The reserve is counted cluster-wide, over all models (seeds: k >= 1). Hiding reserved GPUs is done by clearing
their entry of the snapshot's ``healthy`` column (``hold_back``), so every policy that reads that column — the
balancer, the sharing placements, victim selection — respects the reserve without knowing about it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import msgspec
import numpy as np
import numpy.typing as npt

from shared.policy.placement.balancer import BalancerParams, place
from shared.policy.placement.decision import CannotPlace, Decision, JobRequest, Placement
from shared.policy.request import full_profile
from shared.policy.snapshot import ClusterSnapshot


class ReserveParams(msgspec.Struct, frozen=True, kw_only=True):
    reserve_full: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 1
    """GPUs able to host a full-size instance that small jobs must leave free (0 turns the reserve off)."""


def free_full(snap: ClusterSnapshot) -> npt.NDArray[np.bool_]:
    """Per GPU: healthy and able to host a full-size job now."""
    free: npt.NDArray[np.bool_] = np.asarray(snap.healthy, dtype=bool) & (snap.busy == 0)
    plain = np.flatnonzero(free & ~np.asarray(snap.mig, dtype=bool))
    if plain.size:
        free = free.copy()
        for p in plain:
            # shares have size 0, so the busy column does not show them: look at the instances
            if any(i.busy for i in snap.gpus[p].instances):
                free[p] = False
    return free


def is_full_size(snap: ClusterSnapshot, job: JobRequest, placement: Placement) -> bool:
    """Whether this placement is a full-size one, which may use the reserve."""
    if job.demand.kind == "gpus":
        return True
    if job.demand.kind == "shared":
        return False
    return all(s.profile == full_profile(snap.geometry.model(s.model)).name for s in placement.slots)


def respects_reserve(snap: ClusterSnapshot, job: JobRequest, placement: Placement, k: int) -> bool:
    """False when a placement that is not full-size takes one of the last k free-full GPUs."""
    if k <= 0 or is_full_size(snap, job, placement):
        return True
    free = free_full(snap)
    count = int(free.sum())
    taken = {snap.position[s.gpu_id] for s in placement.slots}
    newly = sum(1 for p in taken if free[p])
    return newly == 0 or count - newly >= k


def hold_back(snap: ClusterSnapshot, k: int) -> tuple[ClusterSnapshot, int]:
    """The snapshot with the free-full GPUs hidden (healthy = False) when only k or fewer are free, and how
    many were hidden. Cheap: ``with_columns`` shares the GPU tuple and every other column."""
    if k <= 0:
        return snap, 0
    free = free_full(snap)
    count = int(free.sum())
    if count == 0 or count > k:
        # above k, one small placement takes at most one free GPU and leaves at least k
        return snap, 0
    held = snap.with_columns(healthy=np.asarray(snap.healthy, dtype=bool) & ~free)
    return held, count


Placer = Callable[[ClusterSnapshot, JobRequest], Decision]


def place_reserving(
    snap: ClusterSnapshot, job: JobRequest, params: ReserveParams | None = None,
    placer: Placer | None = None, balancer: BalancerParams | None = None,
) -> Decision:
    """``placer`` (default: ``balancer.place``) with the reserve applied.

    Full-size requests see the whole cluster. Others are placed on the snapshot with the reserved GPUs hidden;
    when that fails only because of the reserve, the answer is CannotPlace whose first reason is
    "reserved capacity".
    """
    k = (params or ReserveParams()).reserve_full

    def run(s: ClusterSnapshot) -> Decision:
        return placer(s, job) if placer is not None else place(s, job, balancer)

    if k <= 0 or job.demand.kind == "gpus":
        return run(snap)
    held, hidden = hold_back(snap, k)
    if hidden == 0:
        return run(snap)
    first = run(held)
    if isinstance(first, Placement):
        return msgspec.structs.replace(
            first, reasons=(*first.reasons, f"leaves the {hidden} reserved full-size GPU(s) free (k={k})"))
    unrestricted = run(snap)
    if isinstance(unrestricted, Placement) and is_full_size(snap, job, unrestricted):
        reasons = (*unrestricted.reasons, "full-size: may use the reserve")
        return msgspec.structs.replace(unrestricted, reasons=reasons)
    if isinstance(unrestricted, CannotPlace):
        return unrestricted
    reason = (f"reserved capacity: {hidden} GPU(s) able to host a full-size instance are free and "
              f"reserve_full={k} keeps them for full-size jobs")
    return CannotPlace(job_id=job.job_id, policy=first.policy, reasons=(reason, *first.reasons),
                       counts={**first.counts, "reserved capacity": hidden})
