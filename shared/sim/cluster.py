"""The simulated cluster's live MIG state (what GPUs exist: ``cluster_spec``, re-exported here).

``SimCluster`` is the only writer of the state. It keeps the current ``GpuView`` of every GPU and a
``SnapshotBuilder`` that it brings up to date when a snapshot is asked for, so a policy decision reads
``snapshot()`` exactly as the services would; it applies decisions through ``plan_partition`` so the
reconfiguration count is the one the node registry would execute; and it drives the ``PlacementIndex`` that
answers the balancer family's MIG requests (``attach_index``). For the migration planner it keeps, from the
views and only for the GPUs that changed, the pull-source index (``current_pulls``), the defragmentation
screen (``defrag_screen``) and a snapshot that needs no builder flush (``planner_snapshot``), so that most
exits and ticks are answered without a snapshot (``shared.policy.migration.gate``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec
import numpy as np

from shared.mig.geometry import Geometry, GpuModel
from shared.mig.tables import tables_for
from shared.policy.migration.gate import DefragScreen
from shared.policy.migration.moves import MigrationParams
from shared.policy.migration.pull_index import PullIndex
from shared.policy.partition import PartitionPlan, plan_partition
from shared.policy.placement.align_index import AlignIndex
from shared.policy.placement.alignment import AlignParams
from shared.policy.placement.balancer import BalancerParams
from shared.policy.placement.decision import Slot
from shared.policy.placement.index import PlacementIndex
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, SnapshotBuilder
from shared.sim.cluster_spec import ClusterSpec, NodeSpec, gpu_views, load_nodes_file, parse_cluster
from shared.sim.errors import InvariantError

__all__ = ["ClusterSpec", "NodeSpec", "SimCluster", "gpu_views", "load_nodes_file", "parse_cluster"]


_TIMES = frozenset({"started_at", "last_moved_at"})
"""Instance fields no index keeps but the pull index (``SimCluster._retime``)."""


def _build_order(inst: InstanceView) -> tuple[int, str]:
    return (inst.start, inst.id)


class SimCluster:
    """Mutable MIG state of every GPU; all changes go through here so the columns stay consistent."""

    def __init__(self, geometry: Geometry, spec: ClusterSpec) -> None:
        self.geometry = geometry
        self.spec = spec
        self._builder = SnapshotBuilder(geometry)
        self.views: dict[str, GpuView] = {}
        """GPU id -> its current view, in snapshot order. The builder's columns lag behind until a snapshot is
        asked for (``_dirty``): most events need none (the placement index answers MIG requests)."""
        self._dirty: dict[str, None] = {}
        self.index: PlacementIndex | AlignIndex | None = None
        self.pulls: PullIndex | None = None
        self._pull_stale: set[int] = set()
        """Positions changed since the pull index was last brought up to date (from the views, not the
        builder: the migration gate reads the index without a snapshot)."""
        self.screen: DefragScreen | None = None
        self._screen_stale: set[int] = set()
        self._noting: list[set[int]] = []
        """The sets above (and ``_light_stale``) that are in use: each notes every changed position."""
        """Positions changed since the defragmentation screen was last brought up to date."""
        self.where: dict[str, str] = {}
        """instance id -> GPU id"""
        self.used = 0
        """Compute slices held by busy (or reserved) instances, cluster-wide."""
        self.capacity = 0
        self.reconfigurations = 0
        self.models: dict[str, GpuModel] = {}
        """GPU id -> model, so the hot path skips the geometry's name normalisation."""
        self.node_gpus: dict[str, list[str]] = {}
        for g in gpu_views(spec):
            self._builder.put(g)
            self.views[g.id] = g
            self.node_gpus.setdefault(g.node, []).append(g.id)
            self.models[g.id] = geometry.model(g.model)
            self.capacity += self.models[g.id].compute_slices
        self._snap: ClusterSnapshot | None = None
        # what the fragmentation rate reads, kept current on every change (mode and health never change here)
        self.position = {gid: p for p, gid in enumerate(self.views)}
        self.gpu_ids = list(self.views)
        self.by_pos = list(self.views.values())
        """The current views by position (``views`` in snapshot order, as a list: a tuple of it is a copy)."""
        first = self._builder.snapshot()
        self.model_list, self.model_idx, self.usable = first.model_list, first.model_idx, first.ok
        self.model_ids = tuple(id(m) for m in self.model_list)
        self.busy = np.array(first.busy, dtype=np.uint8)
        # the base columns of ``planner_snapshot`` (with ``busy``), brought up to date when one is taken
        self._first = first
        self._idle, self._used = np.array(first.idle), np.array(first.used)
        self._idle_profiles = np.array(first.idle_profiles)
        self._profile_index = {gid: tables_for(m).index for gid, m in self.models.items()}
        self._light: ClusterSnapshot | None = None
        self._light_stale: set[int] | None = None
        """Positions changed since the last ``planner_snapshot`` (None: none taken yet, nothing kept)."""
        self.last_conflict = ""
        self.changes = 0

    def attach_index(self, params: BalancerParams) -> PlacementIndex:
        """Keep a ``PlacementIndex`` for the balancer with ``params`` up to date from now on."""
        self.index = PlacementIndex(self.geometry, list(self.views.values()), params)
        return self.index

    def attach_align_index(self, params: AlignParams) -> AlignIndex:
        """Keep an ``AlignIndex`` (``migsched`` with ``params``) up to date from now on."""
        self.index = AlignIndex(self.geometry, list(self.views.values()), params)
        return self.index

    def attach_pull_index(self, threshold: float, cooldown_s: float | None = None) -> PullIndex:
        """Keep a ``PullIndex`` (the migration planner's pull sources, Busy threshold ``threshold``; cooldown
        mode with ``cooldown_s``) from now on; ``pull_index()`` hands it out synchronised with ``snapshot()``."""
        self.pulls = PullIndex(threshold, cooldown_s)
        self.pulls.sync(self.snapshot())
        # keyed again from the views at first use: in cooldown mode the keys depend on the time
        self._pull_stale.update(range(len(self.gpu_ids)))
        self._noting.append(self._pull_stale)
        return self.pulls

    def attach_defrag_screen(self, params: MigrationParams) -> DefragScreen:
        """Keep a ``DefragScreen`` for the planner with ``params`` from now on (``defrag_screen()``)."""
        self.screen = DefragScreen(params, self.model_list, len(self.gpu_ids),
                                   self.pulls.memos if self.pulls is not None else None)
        self._screen_stale.update(range(len(self.gpu_ids)))
        self._noting.append(self._screen_stale)
        return self.screen

    def defrag_screen(self) -> DefragScreen | None:
        """The defragmentation screen brought up to date with the current views (None when none is kept)."""
        screen = self.screen
        if screen is not None and self._screen_stale:
            views, ids, models = self.views, self.gpu_ids, self.models
            for p in self._screen_stale:
                gid = ids[p]
                screen.update(p, views[gid], models[gid])
            self._screen_stale.clear()
        return screen

    def pull_index(self, now: float | None = None) -> PullIndex | None:
        """The pull index, synchronised with the current ``snapshot()`` (None when none is attached), at
        ``now`` (None: the time it was last brought up to date at)."""
        pulls = self.current_pulls(now)
        if pulls is not None:
            pulls.follow(self.snapshot())
        return pulls

    def current_pulls(self, now: float | None = None) -> PullIndex | None:
        """The pull index brought up to date with the current views at ``now``, without taking a snapshot."""
        pulls = self.pulls
        if pulls is None:
            return None
        if now is None:
            now = pulls.at
        stale = self._pull_stale
        if pulls.cooldown_s is not None:
            due = pulls.due(now)
            if due:
                stale.update(due)
        if stale:
            views, ids = self.views, self.gpu_ids
            for p in stale:
                pulls.update(p, views[ids[p]], now)
            stale.clear()
        return pulls

    # reading -----------------------------------------------------------------------------------------------
    @property
    def builder(self) -> SnapshotBuilder:
        """The snapshot builder, brought up to date."""
        if self._dirty:
            views = self.views
            self._builder.put_many([views[gid] for gid in self._dirty])
            self._dirty.clear()
        return self._builder

    def snapshot(self) -> ClusterSnapshot:
        if self._snap is None:
            # views, not copies: every reader (policy, planner, metrics) is done with it before the next
            # change
            self._snap = self.builder.snapshot(copy=False)
        return self._snap

    def planner_snapshot(self) -> ClusterSnapshot:
        """A snapshot of the current state without bringing the builder up to date: the current views and
        copies of the base columns kept here (mode, health and models never change in a run); any other
        column is derived from the views if read. For the migration planner after an exit, which reads
        GPUs, not columns, when handed the pull index (``moves.after_exit``)."""
        if self._snap is not None:
            return self._snap
        stale = self._light_stale
        if stale is None:  # the first one: from now on the changed GPUs are noted
            stale = self._light_stale = set(range(len(self.gpu_ids)))
            self._noting.append(stale)
        if stale:
            views, ids, index = self.views, self.gpu_ids, self._profile_index
            idle, used, idle_profiles = self._idle, self._used, self._idle_profiles
            for p in stale:
                gid = ids[p]
                view = views[gid]
                idle[p] = view.idle_mask
                used[p] = view.used_compute
                bits = 0
                at = index[gid]
                for i in view.instances:
                    if i.job_id is None:
                        k = at.get(i.profile)
                        if k is not None:
                            bits |= 1 << k
                idle_profiles[p] = bits
            stale.clear()
            self._light = None
        if self._light is None:
            f = self._first
            self._light = ClusterSnapshot(
                self.geometry, tuple(self.by_pos), busy=self.busy.copy(), idle=self._idle.copy(),
                used=self._used.copy(), compute=f.compute, mig=f.mig, healthy=f.healthy,
                idle_profiles=self._idle_profiles.copy(), groups=f.groups, position=f.position,
                model_idx=f.model_idx, model_list=f.model_list, models=f.models,
            )
        return self._light

    def gpu(self, gpu_id: str) -> GpuView:
        return self.views[gpu_id]

    def model(self, gpu_id: str) -> GpuModel:
        return self.models[gpu_id]

    def instance(self, inst_id: str) -> InstanceView | None:
        gid = self.where.get(inst_id)
        return None if gid is None else self.views[gid].instance(inst_id)

    # writing -----------------------------------------------------------------------------------------------
    def _put(self, gpu: GpuView, instances: Iterable[InstanceView], ordered: bool = False) -> GpuView:
        """Replace the GPU's instances; ``ordered`` = already in ``GpuView.build``'s order (start, id).

        The view is derived as ``GpuView.build`` derives it, without re-validating its fields: this runs
        several times per simulated job. Returns the new view."""
        insts = tuple(instances) if ordered else tuple(sorted(instances, key=_build_order))
        busy = idle = used = 0
        for i in insts:
            m = ((1 << i.size) - 1) << i.start
            if i.job_id is None:
                idle |= m
            else:
                busy |= m
                used += i.compute
        new = msgspec.structs.replace(gpu, instances=insts, busy_mask=busy, idle_mask=idle, used_compute=used)
        self.used += used - gpu.used_compute
        gid = gpu.id
        self.views[gid] = new
        pos = self.position[gid]
        self.by_pos[pos] = new
        self.busy[pos] = busy
        if self._noting:  # none without migration: one test per change
            for stale in self._noting:
                stale.add(pos)
            self._light = None
        self._dirty[gid] = None
        self._snap = None
        self.changes += 1
        if self.index is not None:
            self.index.update(new)
        return new

    def apply_slot(self, slot: Slot, job: InstanceView, nonce: str) -> tuple[str, int]:
        """Make ``slot`` real for the job described by ``job`` (a template carrying its fields); return the
        instance id and the GPU-instance operations it took (0 for reuse). A conflict is a policy bug here."""
        got = self.try_apply(slot, job, nonce)
        if got is None:
            raise InvariantError(
                f"placement {slot.profile}@{slot.start} on {slot.gpu_id} for {job.job_id} "
                f"conflicts with the simulated state: {self.last_conflict}"
            )
        return got

    def try_apply(self, slot: Slot, job: InstanceView, nonce: str) -> tuple[str, int] | None:
        """As ``apply_slot`` but None when the slot no longer fits (a planned move gone stale)."""
        gpu = self.views[slot.gpu_id]
        model = self.models[gpu.id]
        plan = plan_partition(gpu, model, slot, nonce)
        if not isinstance(plan, PartitionPlan):
            self.last_conflict = plan.reason
            return None
        # the destroyed instances and ``plan.reconfigurations`` in one pass (none for a reuse)
        destroyed: set[str] = set()
        ops = 0
        for op in plan.ops:
            if op.kind == "destroy_gi":
                destroyed.add(op.instance_id)
                ops += 1
            elif op.kind == "create_gi":
                ops += 1
        prof = model.profile(slot.profile)
        inst = msgspec.structs.replace(
            job,
            id=plan.instance_id,
            profile=prof.name,
            start=slot.start,
            size=prof.memory_slices,
            compute=prof.compute_slices,
        )
        for iid in destroyed:
            del self.where[iid]
        self.where[inst.id] = gpu.id
        old = gpu.instance(inst.id) if not plan.ops else None  # ids are unique on a GPU
        if not plan.ops and (old is None or old.start == inst.start):
            # reuse in place: the instance keeps its id and start, so the order holds
            self._put(gpu, [inst if i.id == inst.id else i for i in gpu.instances], ordered=True)
        else:
            keep = [i for i in gpu.instances if i.id not in destroyed and i.id != plan.instance_id]
            self._put(gpu, [*keep, inst])
        self.reconfigurations += ops
        return inst.id, ops

    def release(self, inst_id: str) -> GpuView:
        """The job on ``inst_id`` is gone: the instance becomes idle (kept for reuse until destroyed)."""
        gpu = self.views[self.where[inst_id]]
        insts = [
            msgspec.structs.replace(
                i,
                job_id=None,
                migratable=True,
                latency_sensitive=False,
                priority=0,
                tenant="",
                last_moved_at=-math.inf,
            )
            if i.id == inst_id
            else i
            for i in gpu.instances
        ]
        return self._put(gpu, insts, ordered=True)

    def destroy(self, inst_id: str) -> None:
        gpu = self.gpu(self.where[inst_id])
        inst = gpu.instance(inst_id)
        if inst is None or inst.busy:
            raise InvariantError(f"cannot destroy {inst_id}: {'busy' if inst else 'missing'}")
        del self.where[inst_id]
        self._put(gpu, [i for i in gpu.instances if i.id != inst_id], ordered=True)
        self.reconfigurations += 1

    def add_idle(self, gpu_id: str, profile: str, start: int, inst_id: str) -> None:
        """Pre-create an idle instance (a static layout); not counted as a reconfiguration of the run."""
        gpu = self.gpu(gpu_id)
        prof = self.models[gpu_id].profile(profile)
        inst = InstanceView(
            id=inst_id, profile=prof.name, start=start, size=prof.memory_slices, compute=prof.compute_slices
        )
        self.where[inst_id] = gpu_id
        self._put(gpu, [*gpu.instances, inst])

    def update(self, inst_id: str, **fields: object) -> None:
        gpu = self.gpu(self.where[inst_id])
        insts = [msgspec.structs.replace(i, **fields) if i.id == inst_id else i for i in gpu.instances]
        if fields.keys() <= _TIMES:
            self._retime(gpu, insts, "last_moved_at" in fields)
        else:
            self._put(gpu, insts, ordered="start" not in fields and "id" not in fields)

    def _retime(self, gpu: GpuView, insts: list[InstanceView], cooldowns: bool) -> None:
        """``_put`` for instances that differ from the GPU's only in their times (``_TIMES``, in the same
        order): no mask, load, profile or job changes, so the placement index, the defragmentation screen and
        the planner snapshot's columns still hold; only the pull index reads a time (``cooldowns``: a
        ``last_moved_at`` changed). A move changes only times twice: its source at the reservation, its destination
        at the switch; each used to re-key the GPU in every index."""
        new = msgspec.structs.replace(gpu, instances=tuple(insts))
        gid = gpu.id
        self.views[gid] = new
        pos = self.position[gid]
        self.by_pos[pos] = new
        if cooldowns and self.pulls is not None:
            self._pull_stale.add(pos)
        self._light = None
        self._dirty[gid] = None
        self._snap = None
        self.changes += 1
        if self.index is not None:
            self.index.retime(pos, new)
