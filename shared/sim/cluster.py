"""The simulated cluster: what GPUs exist (parsed from ``MODEL:COUNT`` or a node file) and the live MIG state.

``SimCluster`` is the only writer of the state. It keeps the current ``GpuView`` of every GPU and a
``SnapshotBuilder`` that it brings up to date when a snapshot is asked for, so a policy decision reads
``snapshot()`` exactly as the services would; it applies decisions through ``plan_partition`` so the
reconfiguration count is the one the partitioner would execute; and it drives the ``PlacementIndex`` that
answers the balancer family's MIG requests (``attach_index``).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec
import numpy as np

from shared.errors import MigschedError
from shared.mig.geometry import Geometry, GpuModel
from shared.mig.occupancy import span
from shared.policy.balancer import BalancerParams
from shared.policy.partition import PartitionPlan, plan_partition
from shared.policy.placement import Slot
from shared.policy.placement_index import PlacementIndex
from shared.policy.pull_index import PullIndex
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, SnapshotBuilder
from shared.sim.errors import ClusterSpecError, InvariantError


class NodeSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    model: str
    gpus: int


class ClusterSpec(msgspec.Struct, frozen=True, kw_only=True):
    nodes: tuple[NodeSpec, ...]

    @property
    def gpu_count(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def label(self) -> str:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.model] = counts.get(n.model, 0) + n.gpus
        return " + ".join(f"{c}x {m}" for m, c in counts.items())


def parse_cluster(specs: Sequence[str], geometry: Geometry, gpus_per_node: int = 8) -> ClusterSpec:
    """``["A100-40GB:48", "H100-80GB:16"]`` -> nodes of ``gpus_per_node`` GPUs (the last node of a model
    may be
    smaller)."""
    if gpus_per_node < 1:
        raise ClusterSpecError(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
    nodes: list[NodeSpec] = []
    for spec in specs:
        name, sep, count_s = spec.rpartition(":")
        if not sep or not name:
            raise ClusterSpecError(f"cluster spec {spec!r} is not MODEL:COUNT (e.g. A100-40GB:64)")
        try:
            count = int(count_s)
        except ValueError:
            raise ClusterSpecError(
                f"cluster spec {spec!r}: GPU count {count_s!r} is not an integer"
            ) from None
        if count < 1:
            raise ClusterSpecError(f"cluster spec {spec!r}: GPU count must be at least 1")
        model = _model(geometry, name, spec)
        while count > 0:
            n = min(gpus_per_node, count)
            nodes.append(NodeSpec(name=f"node-{len(nodes):04d}", model=model.name, gpus=n))
            count -= n
    if not nodes:
        raise ClusterSpecError("the cluster has no GPUs; give --cluster MODEL:COUNT or --nodes-file")
    return ClusterSpec(nodes=tuple(nodes))


def _model(geometry: Geometry, name: str, where: str) -> GpuModel:
    try:
        return geometry.model(name)
    except MigschedError as exc:
        raise ClusterSpecError(f"{where}: {exc}") from None


def load_nodes_file(path: str | Path, geometry: Geometry, model_override: str | None = None) -> ClusterSpec:
    """A CSV with a node name column (``node`` or ``sn``), a GPU count (``gpus`` or ``gpu``) and ``model``.

    ``model_override`` maps every node to one MIG model (the openb node list names non-MIG models such as
    P100).
    """
    p = Path(path)
    try:
        with p.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise ClusterSpecError(f"cannot read nodes file {p}: {exc.strerror}") from None
    if not rows:
        raise ClusterSpecError(f"nodes file {p} has no rows")
    cols = set(rows[0])
    name_col = "node" if "node" in cols else "sn" if "sn" in cols else None
    gpu_col = "gpus" if "gpus" in cols else "gpu" if "gpu" in cols else None
    missing = [c for c, v in (("node|sn", name_col), ("gpus|gpu", gpu_col)) if v is None]
    if model_override is None and "model" not in cols:
        missing.append("model")
    if missing:
        raise ClusterSpecError(
            f"nodes file {p} lacks column(s) {', '.join(missing)}; has {', '.join(sorted(cols))}"
        )
    assert name_col is not None and gpu_col is not None
    nodes: list[NodeSpec] = []
    for i, row in enumerate(rows, start=2):
        try:
            n = int(row[gpu_col])
        except ValueError:
            raise ClusterSpecError(f"{p}:{i}: {gpu_col}={row[gpu_col]!r} is not an integer") from None
        if n <= 0:
            continue
        model = _model(geometry, model_override or row["model"], f"{p}:{i}")
        nodes.append(NodeSpec(name=row[name_col], model=model.name, gpus=n))
    if not nodes:
        raise ClusterSpecError(f"nodes file {p} lists no GPUs")
    return ClusterSpec(nodes=tuple(nodes))


def gpu_views(spec: ClusterSpec) -> list[GpuView]:
    return [
        GpuView.build(id=f"{node.name}/gpu{i}", node=node.name, index=i, model=node.model)
        for node in spec.nodes
        for i in range(node.gpus)
    ]


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
        self.index: PlacementIndex | None = None
        self.pulls: PullIndex | None = None
        self._pull_stale: set[int] = set()
        """Positions flushed into the builder since the pull index was last synchronised."""
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
        first = self._builder.snapshot()
        self.model_list, self.model_idx, self.usable = first.model_list, first.model_idx, first.ok
        self.busy = np.array(first.busy, dtype=np.uint8)
        self.last_conflict = ""
        self.changes = 0

    def attach_index(self, params: BalancerParams) -> PlacementIndex:
        """Keep a ``PlacementIndex`` for the balancer with ``params`` up to date from now on."""
        self.index = PlacementIndex(self.geometry, list(self.views.values()), params)
        return self.index

    def attach_pull_index(self, threshold: float) -> PullIndex:
        """Keep a ``PullIndex`` (the migration planner's pull sources, Busy threshold ``threshold``) from now
        on; ``pull_index()`` hands it out synchronised with ``snapshot()``."""
        self.pulls = PullIndex(threshold)
        self.pulls.sync(self.snapshot())
        self._pull_stale.clear()
        return self.pulls

    def pull_index(self) -> PullIndex | None:
        """The pull index, synchronised with the current ``snapshot()`` (None when none is attached)."""
        if self.pulls is None:
            return None
        snap = self.snapshot()
        if self.pulls.snapshot is not snap:
            self.pulls.sync(snap, self._pull_stale)
            self._pull_stale.clear()
        return self.pulls

    # reading -----------------------------------------------------------------------------------------------
    @property
    def builder(self) -> SnapshotBuilder:
        """The snapshot builder, brought up to date."""
        if self._dirty:
            put = self._builder.put
            for gid in self._dirty:
                put(self.views[gid])
            if self.pulls is not None:
                position = self.position
                self._pull_stale.update(position[gid] for gid in self._dirty)
            self._dirty.clear()
        return self._builder

    def snapshot(self) -> ClusterSnapshot:
        if self._snap is None:
            # views, not copies: every reader (policy, planner, metrics) is done with it before the next
            # change
            self._snap = self.builder.snapshot(copy=False)
        return self._snap

    def gpu(self, gpu_id: str) -> GpuView:
        return self.views[gpu_id]

    def model(self, gpu_id: str) -> GpuModel:
        return self.models[gpu_id]

    def instance(self, inst_id: str) -> InstanceView | None:
        gid = self.where.get(inst_id)
        return None if gid is None else self.views[gid].instance(inst_id)

    # writing -----------------------------------------------------------------------------------------------
    def _put(self, gpu: GpuView, instances: Iterable[InstanceView], ordered: bool = False) -> None:
        """Replace the GPU's instances; ``ordered`` = already in ``GpuView.build``'s order (start, id).

        The view is derived as ``GpuView.build`` derives it, without re-validating its fields: this runs
        several times per simulated job."""
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
        self.used += new.used_compute - gpu.used_compute
        self.views[gpu.id] = new
        self.busy[self.position[gpu.id]] = new.busy_mask
        self._dirty[gpu.id] = None
        self._snap = None
        self.changes += 1
        if self.index is not None:
            self.index.update(new)

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
        gpu = self.gpu(slot.gpu_id)
        model = self.models[gpu.id]
        plan = plan_partition(gpu, model, slot, nonce)
        if not isinstance(plan, PartitionPlan):
            self.last_conflict = plan.reason
            return None
        destroyed = {op.instance_id for op in plan.ops if op.kind == "destroy_gi"}
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
        if not plan.ops and all(i.start == inst.start for i in gpu.instances if i.id == inst.id):
            # reuse in place: the instance keeps its id and start, so the order holds
            self._put(gpu, [inst if i.id == inst.id else i for i in gpu.instances], ordered=True)
        else:
            keep = [i for i in gpu.instances if i.id not in destroyed and i.id != plan.instance_id]
            self._put(gpu, [*keep, inst])
        ops = plan.reconfigurations
        self.reconfigurations += ops
        return inst.id, ops

    def release(self, inst_id: str) -> GpuView:
        """The job on ``inst_id`` is gone: the instance becomes idle (kept for reuse until destroyed)."""
        gpu = self.gpu(self.where[inst_id])
        insts = [
            msgspec.structs.replace(
                i,
                job_id=None,
                migratable=True,
                latency_sensitive=False,
                priority=0,
                tenant="",
                last_moved_at=float("-inf"),
            )
            if i.id == inst_id
            else i
            for i in gpu.instances
        ]
        self._put(gpu, insts, ordered=True)
        return self.gpu(gpu.id)

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
        self._put(
            gpu, [msgspec.structs.replace(i, **fields) if i.id == inst_id else i for i in gpu.instances],
            ordered="start" not in fields and "id" not in fields,
        )

    # checking ----------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise InvariantError if any slice is double-booked or a placement is illegal."""
        for gpu in self.views.values():
            model = self.geometry.model(gpu.model)
            seen = busy = 0
            counts: dict[str, int] = {}
            for inst in gpu.instances:
                prof = model.profile(inst.profile)
                if inst.start not in prof.placements:
                    raise InvariantError(f"{gpu.id}: {inst.id} at illegal start {inst.start}")
                m = span(inst.size, inst.start)
                if seen & m:
                    raise InvariantError(
                        f"{gpu.id}: {inst.id} overlaps slices {seen & m:08b} (double-booked)"
                    )
                seen |= m
                if inst.busy:
                    busy |= m
                counts[prof.name] = counts.get(prof.name, 0) + 1
                if counts[prof.name] > prof.max_count:
                    raise InvariantError(f"{gpu.id}: more than {prof.max_count} x {prof.name}")
                if self.where.get(inst.id) != gpu.id:
                    raise InvariantError(f"{gpu.id}: instance {inst.id} missing from the index")
            if busy != gpu.busy_mask:
                raise InvariantError(f"{gpu.id}: busy mask {gpu.busy_mask:08b} != instances {busy:08b}")
        if self.pulls is not None:
            # the incremental pull index must describe the current snapshot as one rebuilt from scratch does
            kept = self.pull_index()
            fresh = PullIndex(self.pulls.threshold)
            fresh.sync(self.snapshot())
            if kept is None or kept.sources() != fresh.sources():
                raise InvariantError("the migration planner's pull index differs from the cluster's state")
