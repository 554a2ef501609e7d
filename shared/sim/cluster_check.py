"""The simulated cluster is legal, and every index it keeps incrementally describes
it as one rebuilt from scratch would (run after every event under ``--check-invariants``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.mig.occupancy import span
from shared.policy.migration.gate import DefragScreen
from shared.policy.migration.pull_index import PullIndex
from shared.sim.errors import InvariantError

if TYPE_CHECKING:
    from shared.sim.cluster import SimCluster


def check(cluster: SimCluster, now: float | None = None) -> None:
    """Raise InvariantError if any slice is double-booked or a placement is illegal, or a kept index differs
    from the cluster's state."""
    for gpu in cluster.views.values():
        model = cluster.geometry.model(gpu.model)
        seen = busy = 0
        counts: dict[str, int] = {}
        for inst in gpu.instances:
            prof = model.profile(inst.profile)
            if inst.start not in prof.placements:
                raise InvariantError(f"{gpu.id}: {inst.id} at illegal start {inst.start}")
            m = span(inst.size, inst.start)
            if seen & m:
                raise InvariantError(f"{gpu.id}: {inst.id} overlaps slices {seen & m:08b} (double-booked)")
            seen |= m
            if inst.busy:
                busy |= m
            counts[prof.name] = counts.get(prof.name, 0) + 1
            if counts[prof.name] > prof.max_count:
                raise InvariantError(f"{gpu.id}: more than {prof.max_count} x {prof.name}")
            if cluster.where.get(inst.id) != gpu.id:
                raise InvariantError(f"{gpu.id}: instance {inst.id} missing from the index")
        if busy != gpu.busy_mask:
            raise InvariantError(f"{gpu.id}: busy mask {gpu.busy_mask:08b} != instances {busy:08b}")
    if cluster.pulls is not None:
        # the incremental pull index must describe the current snapshot as one rebuilt from scratch does
        kept = cluster.pull_index(now)
        fresh = PullIndex(cluster.pulls.threshold, cluster.pulls.cooldown_s)
        fresh.sync(cluster.snapshot())
        if fresh.cooldown_s is not None:
            for p, gid in enumerate(cluster.gpu_ids):
                fresh.update(p, cluster.views[gid], cluster.pulls.at)
        if kept is None or kept.sources() != fresh.sources():
            raise InvariantError("the migration planner's pull index differs from the cluster's state")
    if cluster.screen is not None:
        kept_screen = cluster.defrag_screen()
        fresh_screen = DefragScreen(cluster.screen.params, cluster.model_list, len(cluster.gpu_ids))
        for p, gid in enumerate(cluster.gpu_ids):
            fresh_screen.update(p, cluster.views[gid], cluster.models[gid])
        if kept_screen is None or kept_screen.state() != fresh_screen.state():
            raise InvariantError("the defragmentation screen differs from the cluster's state")
    if cluster.index is not None and not cluster.index.agrees_with(cluster.by_pos):
        raise InvariantError("the placement index differs from the cluster's state")
