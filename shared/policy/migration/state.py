"""The state of one migration plan while it is built: the snapshot's columns it screens GPUs with, the
virtual copies of the GPUs its moves change, and the rules every move obeys (movable job, Busy tier, the
destination placement of a job's shape)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span
from shared.policy.migration.memos import PlannerMemos
from shared.policy.migration.moves import MigrationParams, Move
from shared.policy.migration.pull_index import PullIndex
from shared.policy.migration.search import VirtualGpu, intra_by_starts, move_bounds, shape_target
from shared.policy.snapshot import ClusterSnapshot, InstanceView


class PlanState:
    """A plan's snapshot, parameters, moves so far and virtual GPUs; the pull search and the move assembly
    build on it (``pull``, ``plan``)."""

    def __init__(self, snap: ClusterSnapshot, now: float, params: MigrationParams,
                 pulls: PullIndex | None = None, memos: PlannerMemos | None = None) -> None:
        self.snap = snap
        self.pulls = pulls
        self.memos = memos if memos is not None else pulls.memos if pulls is not None else PlannerMemos()
        """Memos across plans: the caller's, else its pull index's, else this plan's own."""
        self._model_ids = tuple(id(m) for m in snap.model_list)
        """The caller's incremental pull-source index, used while it describes ``snap`` (simulator)."""
        self.now = now
        self.params = params
        self.t_q = round(params.threshold * 1000)
        self.moved: set[str] = set()
        self.moves: list[Move] = []
        self._gpus: dict[str, VirtualGpu] = {}
        self._changed: dict[int, VirtualGpu] = {}
        """GPUs that planned moves have changed, by position: the only ones the columns do not describe."""
        self._removal = np.zeros(0, dtype=np.int64)
        self._drops: dict[tuple[int, str], npt.NDArray[np.int64]] = {}
        self._by_c: dict[tuple[frozenset[str], ...], npt.NDArray[np.int64]] = {}
        self._asked: set[tuple[frozenset[str], ...]] = set()
        self._every: npt.NDArray[np.intp] | None = None

        self._cols: tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_], npt.NDArray[np.int64],
                          npt.NDArray[np.int64]] | None = None
        self._load_ok: tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]] | None = None

    def columns(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_], npt.NDArray[np.int64],
                               npt.NDArray[np.int64]]:
        """Snapshot columns (valid for GPUs this plan has not touched): load in thousandths, Busy-tier and
        usable, and the per-GPU bounds of the best removal and best intra move (see ``_bounds``)."""
        if self._cols is None:
            snap = self.snap
            load_q, ok = self.load_ok()
            idx = (np.asarray(snap.model_idx, dtype=np.intp) << 8) | np.asarray(snap.busy)
            removal = np.concatenate([move_bounds(m)[0] for m in snap.model_list] or [np.zeros(0, np.int64)])
            self._cols = (load_q, ok, idx * 9, self._intra_bound())
            self._removal = removal
        return self._cols

    def _intra_bound(self) -> npt.NDArray[np.int64]:
        """Per GPU: a lower bound of its best intra move's change, from the shapes of the busy instances it
        really holds (``intra_by_starts`` over ``busy_starts``), not only its busy mask: most Busy GPUs have
        no improving move at all, and this bound says so without reading their instances."""
        snap = self.snap
        bound = np.zeros(len(snap), dtype=np.int64)
        busy = np.asarray(snap.busy, dtype=np.intp) << 8
        starts = snap.busy_starts
        single = len(snap.model_list) == 1
        for k, m in enumerate(snap.model_list):
            on = None if single else np.asarray(snap.model_idx) == k
            for j, prof in enumerate(m.profiles):
                col = starts[:, j]
                if on is not None:
                    col = np.where(on, col, 0)
                if col.any():
                    np.minimum(bound, intra_by_starts(m, prof.name)[busy | col], out=bound)
        return bound

    def load_ok(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """The first two of ``columns()``, alone: a pull needs only them, the bounds are for the tick."""
        if self._load_ok is None:
            # columns the snapshot builder keeps (derived once for a hand-built snapshot)
            load_q = self.snap.load_q
            self._load_ok = (load_q, (load_q >= self.t_q) & self.snap.ok)
        return self._load_ok

    def model_at(self, pos: int) -> GpuModel:
        # the model column, not the geometry's name normalisation (a hot spot when many GPUs are visited)
        return self.snap.model_list[int(self.snap.model_idx[pos])]

    def peek(self, pos: int) -> VirtualGpu:
        """The GPU at ``pos`` as the plan sees it, without keeping a copy of an unchanged one."""
        view = self.snap.gpus[pos]
        return self._gpus.get(view.id) or VirtualGpu(view, self.model_at(pos), pos)

    def gpu(self, gpu_id: str) -> VirtualGpu:
        g = self._gpus.get(gpu_id)
        if g is None:
            pos = self.snap.position[gpu_id]
            view = self.snap.gpus[pos]
            g = VirtualGpu(view, self.model_at(pos), pos)
            self._gpus[gpu_id] = g
        return g

    def changed(self, g: VirtualGpu) -> None:
        self._changed[g.pos] = g

    def usable(self, gpu_id: str) -> bool:
        pos = self.snap.position.get(gpu_id)
        return pos is not None and bool(self.snap.mig[pos]) and bool(self.snap.healthy[pos])

    def full(self) -> bool:
        return len(self.moves) >= self.params.max_moves

    def busy_tier(self, g: VirtualGpu) -> bool:
        return g.load_q() >= self.t_q

    def may_move(self, inst: InstanceView, inter: bool) -> bool:
        return (
            inst.busy
            and inst.migratable
            and not (inter and inst.latency_sensitive)
            and inst.job_id not in self.moved
            and self.now - inst.last_moved_at >= self.params.cooldown_s
        )

    def dst_placement(self, t: VirtualGpu, src: Profile) -> tuple[Profile, int] | None:
        """The target's profile of the source's shape (never less memory, unless the same name) and its best
        start: lowest FragCost after, fewest idle slices destroyed, highest start."""
        key = (id(t.model), t.signature(), id(src))
        memo = self.memos.dst
        got = memo.get(key)
        if got is None:
            # a function of the target's model and instances and of the source profile: memoised across
            # plans (a cluster shows few distinct GPU states), keeping the keys' objects referenced
            got = (t.model, src, _dst_placement(t, src))
            memo.put(key, got)
        return got[2]


def _dst_placement(t: VirtualGpu, src: Profile) -> tuple[Profile, int] | None:
    prof = shape_target(src, t.model)
    if prof is None:
        return None
    busy = t.busy_mask
    best: tuple[tuple[int, int, int], int] | None = None
    for s in prof.placements:
        pm = span(prof.memory_slices, s)
        if pm & busy or not t.count_ok(prof, pm):
            continue
        key = (t.cost_q(busy | pm), sum(i.size for i in t.in_the_way(pm)), -s)
        if best is None or key < best[0]:
            best = (key, s)
    return None if best is None else (prof, best[1])
