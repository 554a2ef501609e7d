"""``ClusterSnapshot``: the GPUs in a fixed order plus read-only numpy columns (one entry per GPU), so that a
decision over thousands of GPUs is a handful of vector operations. ``with_columns`` derives a snapshot with
some columns replaced; columns a hand-built snapshot lacks are derived on first use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.mig.geometry import Geometry, GpuModel
from shared.mig.tables import ModelTables, tables_for
from shared.policy.gpu_view import GpuView, InstanceView
from shared.policy.snapshot_columns import (
    fill_busy_starts,
    fill_idle_starts,
    fill_movable_starts,
    movable_drop_row,
)

Column = npt.NDArray[np.generic]


def gpu_end(gpu: GpuView) -> float:
    """When the GPU's last running job is expected to end; -inf when none runs."""
    end = -math.inf
    for inst in gpu.instances:
        if inst.job_id is not None and inst.expected_end > end:
            end = inst.expected_end
    return end


class ClusterSnapshot:
    """An immutable cluster view: the GPUs in a fixed order plus one read-only column per quantity."""

    __slots__ = (
        "_busy_starts",
        "_cu_idx",
        "_ends",
        "_idle_starts",
        "_load_idx",
        "_load_q",
        "_movable_drops",
        "_movable_starts",
        "_node_empty",
        "_node_end",
        "_node_idx",
        "_ok",
        "_pair",
        "busy",
        "compute",
        "geometry",
        "gpus",
        "groups",
        "healthy",
        "idle",
        "idle_profiles",
        "mig",
        "model_idx",
        "model_list",
        "models",
        "position",
        "used",
    )

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
        ends: Column | None = None,
        node_idx: Column | None = None,
        node_end: Column | None = None,
        node_empty: Column | None = None,
        models: dict[str, GpuModel] | None = None,
        read_only: bool = False,
    ) -> None:
        """``models`` (name -> model of each group) and ``read_only`` (every column given is already
        read-only) let ``SnapshotBuilder`` skip work it has done once for many snapshots."""
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
        self.models: dict[str, GpuModel] = (
            {name: geometry.model(name) for name in groups} if models is None else models
        )
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
        self._ends, self._node_idx = ends, node_idx
        self._node_end, self._node_empty = node_end, node_empty
        if not read_only:
            for col in (busy, idle, used, compute, mig, healthy, idle_profiles, model_idx, pair, load_idx, ok,
                        busy_starts, movable_starts, load_q, cu_idx, movable_drops, ends, node_idx, node_end,
                        node_empty):
                if col is not None:
                    col.setflags(write=False)

    @property
    def idle_starts(self) -> npt.NDArray[np.uint8]:
        """Per GPU and per profile index of its model: a bit per start where an idle instance of it begins.

        Kept by SnapshotBuilder; derived (one pass over GPUs with idle instances) for a hand-built snapshot.
        """
        if self._idle_starts is None:
            self._idle_starts = self._derive_starts(self.idle, fill_idle_starts)
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
            self._busy_starts = self._derive_starts(self.busy, fill_busy_starts)
        return self._busy_starts  # type: ignore[return-value]

    @property
    def movable_starts(self) -> npt.NDArray[np.uint8]:
        """As ``busy_starts`` for the jobs that may move to another GPU at all (migratable and not
        latency-sensitive): the migration planner's pull bound counts only them."""
        if self._movable_starts is None:
            self._movable_starts = self._derive_starts(self.busy, fill_movable_starts)
        return self._movable_starts  # type: ignore[return-value]

    @property
    def movable_drops(self) -> npt.NDArray[np.int64]:
        """Per GPU and per profile index of its model: the most negative quantised FragCost change that taking
        one of its ``movable_starts`` instances of that profile off brings (0 if none lowers it), i.e.
        ``migration.search.removal_by_starts`` at ``busy << 8 | movable_starts``. The planner's pull bound."""
        if self._movable_drops is None:
            col = np.zeros((len(self.gpus), self.movable_starts.shape[1]), dtype=np.int64)
            busy, starts = np.asarray(self.busy), self.movable_starts
            for p in np.flatnonzero(busy).tolist():
                model = self.model_list[int(self.model_idx[p])]
                col[p] = movable_drop_row(model, int(busy[p]), starts[p].tolist(), col.shape[1])
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

    @property
    def ends(self) -> npt.NDArray[np.float64]:
        """Per GPU: when its last busy instance's job is expected to end (``InstanceView.ends_at``); -inf when
        none runs."""
        if self._ends is None:
            col = np.array([gpu_end(g) for g in self.gpus], dtype=np.float64)
            col.setflags(write=False)
            self._ends = col
        return self._ends  # type: ignore[return-value]

    @property
    def node_idx(self) -> npt.NDArray[np.intp]:
        """Per GPU: its node's number, in order of the nodes' first appearance."""
        if self._node_idx is None:
            seen: dict[str, int] = {}
            col = np.array([seen.setdefault(g.node, len(seen)) for g in self.gpus], dtype=np.intp)
            col.setflags(write=False)
            self._node_idx = col
        return self._node_idx  # type: ignore[return-value]

    @property
    def node_end(self) -> npt.NDArray[np.float64]:
        """Per GPU: the latest ``ends`` among its node's GPUs (-inf when none runs): when the node is expected
        to be free."""
        if self._node_end is None:
            node = self.node_idx
            latest = np.full(int(node.max()) + 1 if len(node) else 0, -math.inf)
            np.maximum.at(latest, node, self.ends)
            col = latest[node]
            col.setflags(write=False)
            self._node_end = col
        return self._node_end  # type: ignore[return-value]

    @property
    def node_empty(self) -> npt.NDArray[np.int64]:
        """Per GPU: how many of its node's GPUs are usable (``ok``) and hold no busy instance."""
        if self._node_empty is None:
            node = self.node_idx
            empty = self.ok & (np.asarray(self.busy) == 0)
            col = np.bincount(node, weights=empty, minlength=int(node.max()) + 1 if len(node) else 0
                              ).astype(np.int64)[node]
            col.setflags(write=False)
            self._node_empty = col
        return self._node_empty  # type: ignore[return-value]

    def with_columns(self, **columns: Column) -> ClusterSnapshot:
        """The same snapshot with some columns replaced (e.g. ``healthy``), sharing everything else."""
        current: dict[str, Any] = {
            "busy": self.busy, "idle": self.idle, "used": self.used, "compute": self.compute, "mig": self.mig,
            "healthy": self.healthy, "idle_profiles": self.idle_profiles, "model_idx": self.model_idx,
            "idle_starts": self._idle_starts, "busy_starts": self._busy_starts,
            "movable_starts": self._movable_starts, "ends": self._ends, "node_idx": self._node_idx,
        }
        unknown = set(columns) - set(current)
        if unknown:
            raise TypeError(f"no snapshot column(s) {sorted(unknown)}")
        current.update(columns)
        if not {"ends", "node_idx"} & columns.keys():
            current["node_end"] = self._node_end
        return ClusterSnapshot(self.geometry, self.gpus, groups=self.groups, position=self.position,
                               model_list=self.model_list, **current)

    def without(self, gone: Collection[str]) -> ClusterSnapshot:
        """The same snapshot with the GPUs ``gone`` (ids) unusable, e.g. held for another job (itself when none
        is; no copy of any other column)."""
        if not gone:
            return self
        healthy = np.array(self.healthy, dtype=bool)
        for g in gone:
            healthy[self.position[g]] = False
        return self.with_columns(healthy=healthy)

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
