"""``SnapshotBuilder``: the mutable, incremental keeper of a ``ClusterSnapshot``'s columns for the simulator
and the services, so that taking a snapshot is a cheap copy (or, in the simulator, a set of read-only views).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import cast

import numpy as np
import numpy.typing as npt

from shared.mig.geometry import Geometry, GpuModel
from shared.mig.tables import tables_for
from shared.policy.cluster_snapshot import ClusterSnapshot
from shared.policy.gpu_view import GpuView
from shared.policy.snapshot_columns import movable_drop_row

_SCALARS = ("busy", "idle", "used", "compute", "mig", "healthy", "model_idx", "idle_profiles", "pair", "load_idx",
            "load_q", "cu_idx", "ok", "ends", "node_idx")
"""The one-value columns, in the order ``SnapshotBuilder._place`` returns their values."""
_N_SCALARS = len(_SCALARS)
_ROWS = ("idle_starts", "busy_starts", "movable_starts", "movable_drops")
"""The per-profile columns (a row per GPU), after the one-value ones."""


@functools.cache
def _zeros(width: int) -> tuple[int, ...]:
    return (0,) * width


class SnapshotBuilder:
    """Mutable, incremental keeper of the columns; ``snapshot()`` hands out an immutable copy."""

    drop_row_limit = 1 << 14
    """Movable-drop rows kept (emptied when full): a long-lived builder (the balancer's mirror) meets new GPU
    states for as long as it runs, and each row is a dozen integers."""

    scatter_from = 12
    """``put_many`` writes each column once (one scattered write per column) from this many GPUs; below it,
    one GPU at a time is cheaper (numpy's per-call cost of 19 scattered writes outweighs the per-element
    ones; about even at 16 GPUs)."""

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
        self._node_ids: dict[str, int] = {}
        self._model_list: list[GpuModel] = []
        self._width = max((len(m.profiles) for m in geometry.models), default=1)
        self._by_name: dict[str, tuple[GpuModel, Mapping[str, int]]] = {}
        """Model name as GPUs spell it -> (model, profile index): skips the geometry's name normalisation."""
        self._models: tuple[object, dict[str, GpuModel]] | None = None
        """(the groups it was computed for, model per group name), shared by snapshots while groups last."""
        self._drops: dict[tuple[int, int, tuple[int, ...]], tuple[int, ...]] = {}
        """``movable_drop_row`` by (model slot, busy mask, movable starts): a cluster shows few distinct ones."""
        self._node_at: list[npt.NDArray[np.intp]] = []
        """Per node number, the positions of its GPUs."""
        self._node_of: dict[int, int] = {}
        self._stale_nodes: set[int] = set()
        """Nodes whose columns ``snapshot`` recomputes: a node changed several times between two snapshots is
        recomputed once, and a caller that never takes one (the simulator's placement index) pays nothing."""
        self._grow(64)

    def _join_node(self, pos: int, nid: int) -> None:
        """Move position ``pos`` into node ``nid``'s rows (a GPU seen for the first time, or on a new node)."""
        old = self._node_of.get(pos)
        self._node_of[pos] = nid
        self._node_at[nid] = np.append(self._node_at[nid], pos)
        if old is not None:
            self._node_at[old] = self._node_at[old][self._node_at[old] != pos]
            self._stale_nodes.add(old)

    def _grow(self, cap: int) -> None:
        specs = {"busy": np.uint8, "idle": np.uint8, "used": np.uint8, "compute": np.uint8,
                 "mig": np.bool_, "healthy": np.bool_, "idle_profiles": np.uint32, "model_idx": np.uint8,
                 "pair": np.intp, "load_idx": np.intp, "ok": np.bool_, "load_q": np.int64, "cu_idx": np.intp,
                 "ends": np.float64, "node_idx": np.intp, "node_end": np.float64, "node_empty": np.int64}
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
        pos, row = self._place(gpu)
        c = self._cols
        # one statement per column (not a loop over the names): the services put one GPU at a time
        (c["busy"][pos], c["idle"][pos], c["used"][pos], c["compute"][pos], c["mig"][pos], c["healthy"][pos],
         c["model_idx"][pos], c["idle_profiles"][pos], c["pair"][pos], c["load_idx"][pos], c["load_q"][pos],
         c["cu_idx"][pos], c["ok"][pos], c["ends"][pos], c["node_idx"][pos], c["idle_starts"][pos],
         c["busy_starts"][pos], c["movable_starts"][pos], c["movable_drops"][pos]) = row
        self._stale_nodes.add(cast(int, row[14]))

    def put_many(self, gpus: Iterable[GpuView]) -> None:
        """``put`` each GPU, in order; the columns are written once per column, not once per GPU and column
        (the simulator brings a snapshot up to date by dozens of GPUs at a time). A GPU given twice keeps
        its last view, as with ``put``."""
        gpus = list(gpus)
        if len(gpus) < self.scatter_from:
            for gpu in gpus:
                self.put(gpu)
            return
        rows: dict[int, tuple[object, ...]] = {}
        for gpu in gpus:
            pos, row = self._place(gpu)
            rows[pos] = row
        if not rows:
            return
        at = np.fromiter(rows, dtype=np.intp, count=len(rows))
        cols = list(zip(*rows.values(), strict=True))
        c = self._cols
        for k, name in enumerate(_SCALARS):
            c[name][at] = cols[k]
        for k, name in enumerate(_ROWS):
            c[name][at] = cols[_N_SCALARS + k]
        self._stale_nodes.update(cols[14])

    def _renode(self, nid: int) -> None:
        """Bring node ``nid``'s ``node_end`` and ``node_empty`` up to date on each of its GPUs' rows, from their
        ``ends``, ``ok`` and ``busy``."""
        at, c = self._node_at[nid], self._cols
        if at.size:
            c["node_end"][at] = c["ends"][at].max()
            c["node_empty"][at] = np.count_nonzero(c["ok"][at] & (c["busy"][at] == 0))

    def _place(self, gpu: GpuView) -> tuple[int, tuple[object, ...]]:
        """The GPU's position (added at the end if new) and its column values, in ``_SCALARS`` then ``_ROWS``
        order."""
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
        mid = self._model_ids.get(model.name)
        if mid is None:
            mid = self._model_ids[model.name] = len(self._model_list)
            self._model_list.append(model)
        # the starts columns in one pass over the instances (as snapshot_columns.fill_starts and
        # fill_movable_starts), built as Python lists and written once per row: per-element updates of a
        # numpy row cost more than the whole pass
        nid = self._node_ids.get(gpu.node)
        if nid is None:
            nid = self._node_ids[gpu.node] = len(self._node_ids)
            self._node_at.append(np.zeros(0, dtype=np.intp))
        if self._node_of.get(pos) != nid:
            self._join_node(pos, nid)
        width = self._width
        irow, brow, mrow = [0] * width, [0] * width, [0] * width
        bits = 0
        end = -math.inf
        for inst in gpu.instances:
            if inst.job_id is not None and inst.expected_end > end:
                end = inst.expected_end
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
        drops = _zeros(width)
        if gpu.busy_mask:
            # memoised by model slot, not by model: hashing a GpuModel costs more than the row itself
            dkey = (mid, gpu.busy_mask, tuple(mrow))
            row = self._drops.get(dkey)
            if row is None:
                if len(self._drops) >= self.drop_row_limit:
                    self._drops.clear()
                row = self._drops[dkey] = tuple(movable_drop_row(model, gpu.busy_mask, mrow, width))
            drops = row
        compute = model.compute_slices
        ok = gpu.mig and gpu.healthy
        return pos, (
            gpu.busy_mask, gpu.idle_mask, gpu.used_compute, compute, gpu.mig, gpu.healthy, mid, bits,
            # derived columns the balancer indexes with, kept here so a decision skips ~10 array operations
            (mid << 16) | (gpu.busy_mask << 8) | gpu.idle_mask,
            (mid << 4) | gpu.used_compute,
            # as the load_q property computes it (float64 division, round half to even)
            round(gpu.used_compute * 1000.0 / max(compute, 1)),
            (compute << 4) | gpu.used_compute,
            ok,
            end,
            nid,
            irow, brow, mrow, drops,
        )

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
        for nid in self._stale_nodes:
            self._renode(nid)
        self._stale_nodes.clear()
        n = self._n
        if copy:
            c = {k: v[:n].copy() for k, v in self._cols.items()}
        else:
            # the same read-only views every time, until the columns grow or a GPU is added
            if self._views is None or self._views[0] != n:
                views = {k: v[:n] for k, v in self._cols.items()}
                for v in views.values():
                    v.setflags(write=False)  # read-only views of columns the builder still writes
                self._views = (n, views)
            c = self._views[1]
        if self._models is None or self._models[0] is not self._groups:
            self._models = (self._groups, {name: self.geometry.model(name) for name in self._groups})
        return ClusterSnapshot(
            self.geometry, tuple(self._gpus), groups=self._groups, position=self._frozen_pos,
            model_list=tuple(self._model_list), models=self._models[1], read_only=not copy, **c
        )


def snapshot_of(geometry: Geometry, gpus: Iterable[GpuView]) -> ClusterSnapshot:
    """A snapshot of ``gpus`` built in one go (tests, tools, one-off views)."""
    b = SnapshotBuilder(geometry)
    for g in gpus:
        b.put(g)
    return b.snapshot()
