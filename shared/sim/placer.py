"""What the simulator keeps of the policy between decisions: the incremental index that answers MIG requests
exactly as the policy would, and the jobs its long-gang rule may keep waiting."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shared.policy.placement.align_index import AlignIndex
from shared.policy.placement.alignment import AlignParams
from shared.policy.placement.balancer import BalancerParams
from shared.policy.placement.gang import spans_nodes
from shared.policy.placement.index import PlacementIndex
from shared.policy.placement.long_gangs import is_long
from shared.sim.cluster import SimCluster
from shared.sim.jobs import SimJob


def attach(cluster: SimCluster, policy: Any) -> tuple[PlacementIndex | AlignIndex | None, AlignParams | None]:
    """The index kept on ``cluster`` for ``policy`` (None: the policy is asked with a snapshot each time), and
    the policy's alignment parameters when it is ``migsched``'s family."""
    params = getattr(policy, "balancer_params", None)
    align = getattr(policy, "align_params", None)
    align = align if isinstance(align, AlignParams) else None
    if isinstance(params, BalancerParams):
        # the balancer's exact choice for MIG requests, kept incrementally (shared.policy.placement.index)
        return cluster.attach_index(params), align
    if align is not None and AlignIndex.supports(align):
        # migsched's exact choice for MIG requests, kept incrementally (shared.policy.placement.align_index)
        return cluster.attach_align_index(align), align
    return None, align


def long_gangs(cluster: SimCluster, jobs: Sequence[SimJob], align: AlignParams | None,
               hint: Callable[[int], float | None]) -> frozenset[int]:
    """Jobs the policy's long-gang rule may keep waiting (``shared.policy.placement.long_gangs``): gangs that
    fit on one node and run long for the cluster's size."""
    if align is None:
        return frozenset()
    snap = cluster.snapshot()
    return frozenset(
        i for i, j in enumerate(jobs)
        if j.demand.kind == "gpus" and not spans_nodes(snap, j.demand)
        and is_long(align, j.demand.gpus, hint(i), len(snap)))
