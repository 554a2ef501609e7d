"""The immutable view of the cluster that every policy reads.

``GpuView``/``InstanceView`` are frozen structs; ``ClusterSnapshot`` adds read-only numpy columns (one
entry per GPU) so that a decision over thousands of GPUs is a handful of vector operations.
``SnapshotBuilder`` keeps those columns up to date incrementally for the simulator and the services, so
taking a snapshot is a cheap copy; ``with_columns`` derives a snapshot with some columns replaced.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from shared.mig.geometry import Geometry, GpuModel
from shared.mig.occupancy import span
from shared.mig.tables import ModelTables, tables_for


class InstanceView(msgspec.Struct, frozen=True, kw_only=True):
    """A created GPU instance (GI + CI); busy when a job runs on it, idle when kept for reuse."""

    id: str
    profile: str
    start: int
    size: int
    compute: int
    job_id: str | None = None
    migratable: bool = True
    latency_sensitive: bool = False
    priority: int = 0
    tenant: str = ""
    last_moved_at: float = -math.inf
    started_at: float = 0.0
    preemptible: bool = True
    """False when the job's priority class forbids preempting it (shared.policy.preemption never picks it)."""

    @property
    def busy(self) -> bool:
        return self.job_id is not None

    @property
    def mask(self) -> int:
        return span(self.size, self.start)


class GpuView(msgspec.Struct, frozen=True, kw_only=True):
    """One physical GPU: identity, model, mode and its instances, with derived occupancy."""

    id: str
    node: str
    index: int
    model: str
    mig: bool = True
    healthy: bool = True
    replicas: int = 0
    instances: tuple[InstanceView, ...] = ()
    busy_mask: int = 0
    idle_mask: int = 0
    used_compute: int = 0

    @classmethod
    def build(
        cls,
        *,
        id: str,
        node: str,
        index: int,
        model: str,
        instances: Iterable[InstanceView] = (),
        mig: bool = True,
        healthy: bool = True,
        replicas: int = 0,
    ) -> GpuView:
        insts = tuple(sorted(instances, key=lambda i: (i.start, i.id)))
        busy = idle = used = 0
        for inst in insts:
            if inst.busy:
                busy |= inst.mask
                used += inst.compute
            else:
                idle |= inst.mask
        return cls(
            id=id, node=node, index=index, model=model, mig=mig, healthy=healthy, replicas=replicas,
            instances=insts, busy_mask=busy, idle_mask=idle, used_compute=used,
        )

    def with_instances(self, instances: Iterable[InstanceView]) -> GpuView:
        return GpuView.build(
            id=self.id, node=self.node, index=self.index, model=self.model, instances=instances,
            mig=self.mig, healthy=self.healthy, replicas=self.replicas,
        )

    def instance(self, instance_id: str) -> InstanceView | None:
        for inst in self.instances:
            if inst.id == instance_id:
                return inst
        return None

    def job_instance(self, job_id: str) -> InstanceView | None:
        for inst in self.instances:
            if inst.job_id == job_id:
                return inst
        return None


Column = npt.NDArray[np.generic]


class ClusterSnapshot:
    """An immutable cluster view: the GPUs in a fixed order plus one read-only column per quantity."""

    __slots__ = ("_busy_starts", "_cu_idx", "_idle_starts", "_load_idx", "_load_q", "_movable_drops",
                 "_movable_starts", "_ok", "_pair", "busy", "compute", "geometry",
                 "gpus", "groups", "healthy", "idle",
                 "idle_profiles", "mig", "model_idx", "model_list", "models", "position", "used")

    def __init__(
        self,
        geometry: Geometry,
        gpus: tuple[GpuView, ...],
        *,
        busy: Column,
        idle: Column,
        used: Column,
        compute: Column,
        mig: Column,
        healthy: Column,
        idle_profiles: Column,
        groups: Mapping[str, npt.NDArray[np.intp]],
        position: Mapping[str, int],
        model_idx: Column | None = None,
        model_list: tuple[GpuModel, ...] | None = None,
        idle_starts: Column | None = None,
        pair: Column | None = None,
        load_idx: Column | None = None,
        ok: Column | None = None,
        busy_starts: Column | None = None,
        movable_starts: Column | None = None,
        load_q: Column | None = None,
        cu_idx: Column | None = None,
        movable_drops: Column | None = None,
    ) -> None:
        self.geometry = geometry
        self.gpus = gpus
        self.busy = busy
        self.idle = idle
        self.used = used
        self.compute = compute
        self.mig = mig
        self.healthy = healthy
        self.idle_profiles = idle_profiles
        self.groups = groups
        self.position = position
        self.models: dict[str, GpuModel] = {name: geometry.model(name) for name in groups}
        if model_idx is None or model_list is None:
            # built by hand rather than by SnapshotBuilder: derive the model column from the groups
            model_list = tuple(self.models.values())
            model_idx = np.zeros(len(gpus), dtype=np.uint8)
            for k, pos in enumerate(groups.values()):
                model_idx[pos] = k
        self.model_idx = model_idx
        self.model_list = model_list
        self._idle_starts = idle_starts
        self._pair, self._load_idx, self._ok = pair, load_idx, ok
        self._busy_starts = busy_starts
        self._movable_starts = movable_starts
        self._load_q, self._cu_idx, self._movable_drops = load_q, cu_idx, movable_drops
        for col in (busy, idle, used, compute, mig, healthy, idle_profiles, model_idx, pair, load_idx, ok,
                    busy_starts, movable_starts, load_q, cu_idx, movable_drops):
            if col is not None:
                col.setflags(write=False)

    @property
    def idle_starts(self) -> npt.NDArray[np.uint8]:
        """Per GPU and per profile index of its model: a bit per start where an idle instance of it begins.

        Kept by SnapshotBuilder; derived (one pass over GPUs with idle instances) for a hand-built snapshot.
        """
        if self._idle_starts is None:
            self._idle_starts = self._derive_starts(self.idle, _fill_idle_starts)
        return self._idle_starts  # type: ignore[return-value]

    def _derive_starts(self, mask: Column, fill: Callable[[npt.NDArray[np.uint8], GpuView, Mapping[str, int]],
                                                          None]) -> npt.NDArray[np.uint8]:
        """A starts column for a hand-built snapshot: ``fill`` for each GPU whose ``mask`` column is set."""
        width = max((len(m.profiles) for m in self.model_list), default=1)
        col = np.zeros((len(self.gpus), width), dtype=np.uint8)
        for p in np.flatnonzero(np.asarray(mask)).tolist():
            gpu = self.gpus[p]
            fill(col[p], gpu, tables_for(self.geometry.model(gpu.model)).index)
        col.setflags(write=False)
        return col

    @property
    def busy_starts(self) -> npt.NDArray[np.uint8]:
        """As ``idle_starts`` for busy instances: which jobs a GPU holds, so the migration planner can bound
        what moving one of them gains without reading the GPU's instances."""
        if self._busy_starts is None:
            self._busy_starts = self._derive_starts(self.busy, _fill_busy_starts)
        return self._busy_starts  # type: ignore[return-value]

    @property
    def movable_starts(self) -> npt.NDArray[np.uint8]:
        """As ``busy_starts`` for the jobs that may move to another GPU at all (migratable and not
        latency-sensitive): the migration planner's pull bound counts only them."""
        if self._movable_starts is None:
            self._movable_starts = self._derive_starts(self.busy, _fill_movable_starts)
        return self._movable_starts  # type: ignore[return-value]

    @property
    def movable_drops(self) -> npt.NDArray[np.int64]:
        """Per GPU and per profile index of its model: the most negative quantised FragCost change that taking
        one of its ``movable_starts`` instances of that profile off brings (0 if none lowers it), i.e.
        ``migration_search.removal_by_starts`` at ``busy << 8 | movable_starts``. The planner's pull bound."""
        if self._movable_drops is None:
            col = np.zeros((len(self.gpus), self.movable_starts.shape[1]), dtype=np.int64)
            busy, starts = np.asarray(self.busy), self.movable_starts
            for p in np.flatnonzero(busy).tolist():
                model = self.model_list[int(self.model_idx[p])]
                col[p] = _movable_drop_row(model, int(busy[p]), starts[p].tolist(), col.shape[1])
            col.setflags(write=False)
            self._movable_drops = col
        return self._movable_drops  # type: ignore[return-value]

    @property
    def load_q(self) -> npt.NDArray[np.int64]:
        """Per GPU: load (used / total compute slices) in thousandths, rounded half to even."""
        if self._load_q is None:
            col = np.rint(np.asarray(self.used, dtype=np.float64) * 1000.0
                          / np.maximum(np.asarray(self.compute), 1)).astype(np.int64)
            col.setflags(write=False)
            self._load_q = col
        return self._load_q  # type: ignore[return-value]

    @property
    def cu_idx(self) -> npt.NDArray[np.intp]:
        """Per GPU: ``compute << 4 | used``, indexing per-(size, load) tables such as the planner's size cap."""
        if self._cu_idx is None:
            col = (np.asarray(self.compute, dtype=np.intp) << 4) | np.asarray(self.used, dtype=np.intp)
            col.setflags(write=False)
            self._cu_idx = col
        return self._cu_idx  # type: ignore[return-value]

    @property
    def pair(self) -> npt.NDArray[np.intp]:
        """Per GPU: ``model << 16 | busy << 8 | idle``, indexing the balancer's stacked create tables."""
        if self._pair is None:
            col = (self.model_idx.astype(np.intp) << 16) | (self.busy.astype(np.intp) << 8) | self.idle.astype(np.intp)
            col.setflags(write=False)
            self._pair = col
        return self._pair  # type: ignore[return-value]

    @property
    def load_idx(self) -> npt.NDArray[np.intp]:
        """Per GPU: ``model << 4 | used compute slices``, the index into the balancer's tier/load table."""
        if self._load_idx is None:
            col = (self.model_idx.astype(np.intp) << 4) | self.used.astype(np.intp)
            col.setflags(write=False)
            self._load_idx = col
        return self._load_idx  # type: ignore[return-value]

    @property
    def ok(self) -> npt.NDArray[np.bool_]:
        """Per GPU: usable for MIG placements (in MIG mode and healthy)."""
        if self._ok is None:
            col = np.asarray(self.mig, dtype=bool) & np.asarray(self.healthy, dtype=bool)
            col.setflags(write=False)
            self._ok = col
        return self._ok  # type: ignore[return-value]

    def with_columns(self, **columns: Column) -> ClusterSnapshot:
        """The same snapshot with some columns replaced (e.g. ``healthy``), sharing everything else."""
        current: dict[str, Any] = {
            "busy": self.busy, "idle": self.idle, "used": self.used, "compute": self.compute, "mig": self.mig,
            "healthy": self.healthy, "idle_profiles": self.idle_profiles, "model_idx": self.model_idx,
            "idle_starts": self._idle_starts, "busy_starts": self._busy_starts,
            "movable_starts": self._movable_starts,
        }
        unknown = set(columns) - set(current)
        if unknown:
            raise TypeError(f"no snapshot column(s) {sorted(unknown)}")
        current.update(columns)
        return ClusterSnapshot(self.geometry, self.gpus, groups=self.groups, position=self.position,
                               model_list=self.model_list, **current)

    @classmethod
    def of(cls, geometry: Geometry, gpus: Iterable[GpuView]) -> ClusterSnapshot:
        b = SnapshotBuilder(geometry)
        for g in gpus:
            b.put(g)
        return b.snapshot()

    def __len__(self) -> int:
        return len(self.gpus)

    def gpu(self, gpu_id: str) -> GpuView:
        return self.gpus[self.position[gpu_id]]

    def tables(self, model: str) -> ModelTables:
        return tables_for(self.models[model])

    def load(self) -> npt.NDArray[np.float64]:
        return self.used / np.maximum(self.compute, 1)

    def find_job(self, job_id: str) -> tuple[GpuView, InstanceView] | None:
        for g in self.gpus:
            inst = g.job_instance(job_id)
            if inst is not None:
                return g, inst
        return None


def _fill_idle_starts(row: npt.NDArray[np.uint8], gpu: GpuView, index: Mapping[str, int]) -> None:
    _fill_starts(row, gpu, index, busy=False)


def _fill_busy_starts(row: npt.NDArray[np.uint8], gpu: GpuView, index: Mapping[str, int]) -> None:
    _fill_starts(row, gpu, index, busy=True)


def _fill_starts(row: npt.NDArray[np.uint8], gpu: GpuView, index: Mapping[str, int], *, busy: bool) -> None:
    row[:] = 0
    for inst in gpu.instances:
        if inst.busy == busy and inst.profile in index:
            row[index[inst.profile]] |= 1 << inst.start


def _movable_drop_row(model: GpuModel, busy: int, starts: list[int], width: int) -> list[int]:
    """``movable_drops`` of one GPU: per profile index, ``removal_by_starts(model, profile)[busy << 8 |
    starts]`` computed directly (the same integers; snapshot.py cannot import the planner's tables)."""
    cost = _fragcost_list(model)
    row = [0] * width
    for k, bits in enumerate(starts):
        if not bits or k >= len(model.profiles):
            continue
        size = model.profiles[k].memory_slices
        best = 0
        for st in range(model.memory_slices - size + 1):
            if (bits >> st) & 1:
                best = min(best, cost[busy & ~(((1 << size) - 1) << st)] - cost[busy])
        row[k] = best
    return row


@functools.cache
def _fragcost_list(model: GpuModel) -> list[int]:
    return [int(v) for v in tables_for(model).fragcost_q]


def _fill_movable_starts(row: npt.NDArray[np.uint8], gpu: GpuView, index: Mapping[str, int]) -> None:
    row[:] = 0
    for inst in gpu.instances:
        if inst.busy and inst.migratable and not inst.latency_sensitive and inst.profile in index:
            row[index[inst.profile]] |= 1 << inst.start


class SnapshotBuilder:
    """Mutable, incremental keeper of the columns; ``snapshot()`` hands out an immutable copy."""

    def __init__(self, geometry: Geometry) -> None:
        self.geometry = geometry
        self._gpus: list[GpuView] = []
        self._pos: dict[str, int] = {}
        self._cap = 0
        self._n = 0
        self._cols: dict[str, np.ndarray] = {}
        self._groups: dict[str, npt.NDArray[np.intp]] | None = None
        self._frozen_pos: Mapping[str, int] | None = None
        self._model_ids: dict[str, int] = {}
        self._model_list: list[GpuModel] = []
        self._width = max((len(m.profiles) for m in geometry.models), default=1)
        self._by_name: dict[str, tuple[GpuModel, Mapping[str, int]]] = {}
        """Model name as GPUs spell it -> (model, profile index): skips the geometry's name normalisation."""
        self._grow(64)

    def _grow(self, cap: int) -> None:
        specs = {"busy": np.uint8, "idle": np.uint8, "used": np.uint8, "compute": np.uint8,
                 "mig": np.bool_, "healthy": np.bool_, "idle_profiles": np.uint32, "model_idx": np.uint8,
                 "pair": np.intp, "load_idx": np.intp, "ok": np.bool_, "load_q": np.int64, "cu_idx": np.intp}
        new: dict[str, np.ndarray] = {k: np.zeros(cap, dtype=t) for k, t in specs.items()}
        new["idle_starts"] = np.zeros((cap, self._width), dtype=np.uint8)
        new["busy_starts"] = np.zeros((cap, self._width), dtype=np.uint8)
        new["movable_starts"] = np.zeros((cap, self._width), dtype=np.uint8)
        new["movable_drops"] = np.zeros((cap, self._width), dtype=np.int64)
        for k, col in self._cols.items():
            new[k][: self._n] = col[: self._n]
        self._cols = new
        self._cap = cap
        self._views: tuple[int, dict[str, np.ndarray]] | None = None

    def __len__(self) -> int:
        return self._n

    def __contains__(self, gpu_id: str) -> bool:
        return gpu_id in self._pos

    def get(self, gpu_id: str) -> GpuView:
        return self._gpus[self._pos[gpu_id]]

    def put(self, gpu: GpuView) -> None:
        """Add a GPU or replace the GPU of the same id."""
        got = self._by_name.get(gpu.model)
        if got is None:
            m = self.geometry.model(gpu.model)
            got = self._by_name[gpu.model] = (m, tables_for(m).index)
        model, index = got
        pos = self._pos.get(gpu.id)
        if pos is None:
            if self._n == self._cap:
                self._grow(self._cap * 2)
            pos = self._n
            self._n += 1
            self._pos[gpu.id] = pos
            self._gpus.append(gpu)
            self._groups = None
            self._frozen_pos = None
        else:
            if self._gpus[pos].model != gpu.model:
                self._groups = None
            self._gpus[pos] = gpu
        c = self._cols
        c["busy"][pos] = gpu.busy_mask
        c["idle"][pos] = gpu.idle_mask
        c["used"][pos] = gpu.used_compute
        c["compute"][pos] = model.compute_slices
        c["mig"][pos] = gpu.mig
        c["healthy"][pos] = gpu.healthy
        mid = self._model_ids.get(model.name)
        if mid is None:
            mid = self._model_ids[model.name] = len(self._model_list)
            self._model_list.append(model)
        c["model_idx"][pos] = mid
        # the starts columns in one pass over the instances (as _fill_starts and _fill_movable_starts)
        irow, brow, mrow = c["idle_starts"][pos], c["busy_starts"][pos], c["movable_starts"][pos]
        irow[:] = 0
        brow[:] = 0
        mrow[:] = 0
        bits = 0
        for inst in gpu.instances:
            k = index.get(inst.profile)
            if k is None:
                continue
            b = 1 << inst.start
            if inst.job_id is None:
                irow[k] |= b
                bits |= 1 << k
            else:
                brow[k] |= b
                if inst.migratable and not inst.latency_sensitive:
                    mrow[k] |= b
        c["idle_profiles"][pos] = bits
        c["movable_drops"][pos] = (_movable_drop_row(model, gpu.busy_mask, mrow.tolist(), self._width)
                                   if gpu.busy_mask else 0)
        # derived columns the balancer indexes with, kept here so a decision skips ~10 array operations
        c["pair"][pos] = (mid << 16) | (gpu.busy_mask << 8) | gpu.idle_mask
        c["load_idx"][pos] = (mid << 4) | gpu.used_compute
        # as the load_q property computes it (float64 division, round half to even)
        c["load_q"][pos] = round(gpu.used_compute * 1000.0 / max(model.compute_slices, 1))
        c["cu_idx"][pos] = (model.compute_slices << 4) | gpu.used_compute
        c["ok"][pos] = gpu.mig and gpu.healthy

    def snapshot(self, copy: bool = True) -> ClusterSnapshot:
        """An immutable snapshot. ``copy=False`` hands out read-only views of the builder's columns instead of
        copies: valid only until the next ``put`` (the simulator asks a policy and applies the answer before
        it changes anything, so it need not pay for ten column copies per decision)."""
        if self._groups is None:
            groups: dict[str, list[int]] = {}
            for i, g in enumerate(self._gpus):
                groups.setdefault(self.geometry.model(g.model).name, []).append(i)
            self._groups = {k: np.asarray(v, dtype=np.intp) for k, v in groups.items()}
            for arr in self._groups.values():
                arr.setflags(write=False)
        if self._frozen_pos is None:
            self._frozen_pos = MappingProxyType(dict(self._pos))
        n = self._n
        if copy:
            c = {k: v[:n].copy() for k, v in self._cols.items()}
        else:
            # the same read-only views every time, until the columns grow or a GPU is added
            if self._views is None or self._views[0] != n:
                self._views = (n, {k: v[:n] for k, v in self._cols.items()})
            c = self._views[1]
        return ClusterSnapshot(
            self.geometry, tuple(self._gpus), groups=self._groups, position=self._frozen_pos,
            model_list=tuple(self._model_list), **c
        )
