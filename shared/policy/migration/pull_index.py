"""An incremental source index for the migration planner's pulls, for a caller that changes one GPU at a time.

A pull into a Lazy target visits source GPUs best bound first (``migration_pull.PullSearch.best_pull``): the
bound of a GPU is the best FragCost drop among its movable jobs that the target can host and that are small
enough to move there (``removal_bound``). Computing it from the snapshot's columns costs a dozen numpy
operations over every GPU per pull. Yet a GPU's bound depends only on the GPU's *source key* -- its model,
``cu_idx`` (compute and used slices, which fix its load and the size cap), its load and its ``movable_drops``
row -- and on the target, and a Busy cluster shows few distinct source keys (about ten at 1,000 GPUs). This
index keeps the candidate sources (usable, Busy tier, some movable job whose removal lowers FragCost) grouped
by source key, each group's positions sorted, and recomputes only the GPUs the caller says changed. A pull
then computes one bound per group and walks the groups best first, positions in order.

Exactness. ``heads`` yields ``(bound, -load, position)`` for exactly the GPUs whose column bound is < 0, with
the same bound, in increasing order: the sequence ``best_pull`` builds from the columns. ``best_pull`` uses it
only for the snapshot the index was last synchronised with (``snapshot``), and
``tests/unit/test_migration_pull_index.py`` checks pulls and plans with and without the index over random
clusters and random changes.

Cooldown mode (``cooldown_s``, for a caller that knows the time: the simulator). A job still in its cooldown
cannot be pulled, yet the snapshot's ``movable_drops`` count it, so after a burst of moves many sources have a
bound < 0 and no pullable job. In this mode ``update`` keys a GPU by the jobs out of their cooldown at ``now``
only, and ``due`` names the GPUs to key again once a cooldown may have ended. Its heads are then a subset of
the column search's, each bound no smaller: still a lower bound of every pull the planner may make from that
GPU at that time, and every GPU left out has none, so ``best_pull`` finds the same pull (it takes the
smallest key among the allowed pulls; the heads only order the visit and end it), and a target with no head
gets none (``migration_gate``). ``tests/unit/test_migration_gate.py`` checks plans with and without it.

Pure: a data structure the caller drives with ``sync`` or ``update`` (the time handed in); no clock, I/O or
randomness.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Container, Iterable, Iterator

import numpy as np

from shared.mig.geometry import GpuModel
from shared.mig.tables import tables_for
from shared.policy.gpu_view import GpuView
from shared.policy.migration.memos import PlannerMemos
from shared.policy.snapshot import ClusterSnapshot
from shared.policy.snapshot_columns import movable_drop_row

SourceKey = tuple[int, int, int, tuple[int, ...]]
"""(model index, ``cu_idx``, load in thousandths, ``movable_drops`` row): all a source's bound depends on."""
Head = tuple[int, int, int]
"""(bound, -load in thousandths, position), the order in which ``best_pull`` visits sources."""

_MEMO_LIMIT = 200_000


class PullIndex:
    """Candidate pull sources of one snapshot, grouped by source key; ``sync`` follows the snapshot."""

    def __init__(self, threshold: float, cooldown_s: float | None = None) -> None:
        self.threshold = threshold
        self.t_q = round(threshold * 1000)
        """The planner's Busy threshold in thousandths (``PlanState.t_q``)."""
        self.memos = PlannerMemos()
        """The planner's memos for every plan this index serves (its views live on, so they are hit plan
        after plan)."""
        self.cooldown_s = cooldown_s
        """None: a job counts as movable whatever its cooldown (``sync``, the snapshot's ``movable_drops``).
        Else ``update`` leaves out jobs still in this cooldown at ``at``: tighter bounds, still lower bounds
        of every pull the planner may make at ``at`` (``describes``)."""
        self.at = -math.inf
        """The time the keys hold at (cooldown mode): that of the last ``due`` or ``update``."""
        self._cooling: list[tuple[float, int]] = []
        """(earliest time a left-out job's cooldown may have ended, position), a heap; ``_recheck`` has the
        current entry per position (older ones are skipped)."""
        self._recheck: dict[int, float] = {}
        self.snapshot: ClusterSnapshot | None = None
        """The snapshot the index describes; the planner uses the index for that snapshot only."""
        self._keys: list[SourceKey | None] = []
        self._groups: dict[SourceKey, list[int]] = {}
        self._models: tuple[GpuModel, ...] = ()
        self._profiles: list[dict[str, tuple[int, int]]] = []
        """Per model index: profile name -> (column in ``movable_drops``, compute slices)."""
        self._at: list[tuple[int, GpuModel, dict[str, int]]] = []
        """Per position: model index, model and profile -> column (``update``'s view of the columns)."""
        self._width = 0
        self._loads: list[list[int]] = []
        self._drops: dict[tuple[int, int, tuple[int, ...]], tuple[int, ...]] = {}
        self._ids: dict[SourceKey, int] = {}
        """A number per source key ever seen: memo keys hash one int instead of the key's nested tuple."""
        self._bounds: dict[tuple[int, tuple[frozenset[str], ...], int], int] = {}
        self._ranked: dict[tuple[int, int, tuple[frozenset[str], ...]], list[tuple[int, int, list[SourceKey]]]] = {}
        """Per target (used, compute, hostable): the runs of groups with a bound < 0, best first, for the
        current set of groups (cleared when a group appears or empties)."""
        self._appeared: list[SourceKey] = []
        """Groups in the order they appeared (again after emptying): what may turn a "no" of ``any_head``."""
        self._any: dict[tuple[int, int, tuple[frozenset[str], ...]], SourceKey | int] = {}
        """Per target, ``any_head``'s answer: a group with a bound < 0 (yes, while the group lasts), or how many
        groups had appeared when none had one (no, until one of those appearing since has)."""

    def sync(self, snap: ClusterSnapshot, changed: Iterable[int] | None = None) -> None:
        """Describe ``snap`` from now on. ``changed``: the positions of the GPUs that differ from the snapshot
        of the previous ``sync`` (None, or a different GPU list or model list: rebuild from scratch). Keys
        ignore cooldowns: in cooldown mode, ``update`` every GPU afterwards."""
        if changed is None or len(snap) != len(self._keys) or snap.model_list != self._models:
            self._rebuild(snap)
        else:
            for p in changed:
                self._set(p, self._key_of(snap, p))
        self.snapshot = snap

    def _rebuild(self, snap: ClusterSnapshot) -> None:
        self._models = snap.model_list
        self._drops.clear()
        self._profiles = [
            {p.name: (tables_for(m).index[p.name], p.compute_slices) for p in m.profiles} for m in self._models
        ]
        self._bounds.clear()
        self._ids.clear()
        self._ranked.clear()
        self._any.clear()
        self._appeared.clear()
        self._cooling.clear()
        self._recheck.clear()
        self._keys = [None] * len(snap)
        self._groups = {}
        indexes = [tables_for(m).index for m in self._models]
        # per model, load_q per used compute slices (``SnapshotBuilder``'s formula, tabulated)
        self._loads = [[round(u * 1000.0 / max(m.compute_slices, 1)) for u in range(m.compute_slices + 1)]
                       for m in self._models]
        self._at = [(k, self._models[k], indexes[k]) for k in np.asarray(snap.model_idx).tolist()]
        self._width = int(snap.movable_drops.shape[1])
        if not len(snap):
            return
        load_q = np.asarray(snap.load_q)
        cand = (load_q >= self.t_q) & np.asarray(snap.ok) & (np.asarray(snap.movable_drops).min(axis=1) < 0)
        for p in np.flatnonzero(cand).tolist():
            self._set(p, self._key_of(snap, p))

    def _key_of(self, snap: ClusterSnapshot, p: int) -> SourceKey | None:
        """The GPU's source key, None when it is no candidate source (as ``load_ok`` and a bound < 0 say)."""
        lq = snap.load_q.item(p)
        if lq < self.t_q or not snap.ok.item(p):
            return None
        drops = tuple(snap.movable_drops[p].tolist())
        if min(drops, default=0) >= 0:
            return None
        return snap.model_idx.item(p), snap.cu_idx.item(p), lq, drops

    def update(self, p: int, gpu: GpuView, now: float = -math.inf) -> None:
        """Follow a change of the GPU at ``p`` (same model) without a snapshot: its key computed from the view
        as ``SnapshotBuilder`` fills the columns ``_key_of`` reads (the same integers; in cooldown mode, over
        the jobs out of their cooldown at ``now`` only). The caller then ``follow``s the snapshot of the new
        state, if it takes one; until then ``snapshot`` is None."""
        self.snapshot = None
        if self._recheck:
            self._recheck.pop(p, None)
        cooldown, cooled = self.cooldown_s, math.inf
        if cooldown is not None:
            self.at = now
        k, model, index = self._at[p]
        loads = self._loads[k]
        used = gpu.used_compute
        lq = loads[used] if used < len(loads) else round(used * 1000.0 / max(model.compute_slices, 1))
        if lq < self.t_q or not (gpu.mig and gpu.healthy) or not gpu.busy_mask:
            if self._keys[p] is not None:
                self._set(p, None)
            return
        row = [0] * self._width
        for inst in gpu.instances:
            if inst.job_id is not None and inst.migratable and not inst.latency_sensitive:
                if cooldown is not None and not now - inst.last_moved_at >= cooldown:
                    # ``may_move``'s test, as the planner makes it; looked at again a little before the sum
                    # says it ends, so that rounding cannot make the index late
                    end = inst.last_moved_at + cooldown
                    cooled = min(cooled, end - 1e-9 * max(1.0, abs(end)))
                    continue
                col = index.get(inst.profile)
                if col is not None:
                    row[col] |= 1 << inst.start
        if cooled < math.inf:
            self._recheck[p] = cooled
            heapq.heappush(self._cooling, (cooled, p))
        dkey = (k, gpu.busy_mask, tuple(row))
        drops = self._drops.get(dkey)
        if drops is None:
            # by model slot, not model: hashing a GpuModel costs more than the row (as SnapshotBuilder does)
            if len(self._drops) >= _MEMO_LIMIT:
                self._drops.clear()
            drops = tuple(movable_drop_row(model, gpu.busy_mask, row, self._width))
            # a row with no drop < 0 is kept as () (no candidate): its minimum is not taken again per update
            drops = self._drops[dkey] = drops if min(drops, default=0) < 0 else ()
        if not drops:
            self._set(p, None)
            return
        self._set(p, (k, (model.compute_slices << 4) | used, lq, drops))

    def due(self, now: float) -> list[int]:
        """Cooldown mode: the positions whose keys may have changed by ``now`` because a job's cooldown ended;
        the caller ``update``s them (at ``now``) before the index is read. Keys then hold at ``now``."""
        self.at = now
        cooling = self._cooling
        if not cooling or cooling[0][0] > now:
            return []
        out: list[int] = []
        recheck = self._recheck
        while cooling and cooling[0][0] <= now:
            t, p = heapq.heappop(cooling)
            if recheck.get(p) == t:
                del recheck[p]
                out.append(p)
        return out

    def describes(self, now: float, cooldown_s: float) -> bool:
        """Whether the planner, at ``now`` with cooldown ``cooldown_s``, may take its sources from the index:
        always without cooldown mode; in it, for the same cooldown at the time the keys hold at."""
        return self.cooldown_s is None or (self.cooldown_s == cooldown_s and self.at == now)

    def follow(self, snap: ClusterSnapshot) -> None:
        """``snap`` shows the state the index was last ``update``d to: the planner may use the index for it."""
        self.snapshot = snap

    def any_head(self, t_used: int, t_compute: int, hostable: tuple[frozenset[str], ...]) -> bool:
        """Whether ``heads`` (skipping nothing) yields anything: some source has a bound < 0 for the target."""
        target = (t_used, t_compute, hostable)
        got = self._any.get(target)
        groups = self._groups
        if got is None:
            # a scan that stops at the first source, not a ranking: most targets are screened, few pulled
            candidates: Iterable[SourceKey] = groups
        elif isinstance(got, int):
            candidates = self._appeared[got:]  # a bound is the key's: only groups new since can say yes
        elif got in groups:
            return True
        else:
            candidates = groups
        for key in candidates:
            if key in groups and self.bound(key, t_used, t_compute, hostable) < 0:
                self._remember(target, key)
                return True
        self._remember(target, len(self._appeared))
        return False

    def _remember(self, target: tuple[int, int, tuple[frozenset[str], ...]], answer: SourceKey | int) -> None:
        if len(self._any) >= _MEMO_LIMIT or len(self._appeared) >= _MEMO_LIMIT:
            self._any.clear()
            if len(self._appeared) >= _MEMO_LIMIT:
                self._appeared.clear()
                answer = 0 if isinstance(answer, int) else answer
        self._any[target] = answer

    def _set(self, p: int, key: SourceKey | None) -> None:
        old = self._keys[p]
        if old == key:
            return
        if old is not None:
            members = self._groups[old]
            del members[bisect.bisect_left(members, p)]
            if not members:
                del self._groups[old]
                self._ranked.clear()
        if key is not None:
            group = self._groups.get(key)
            if group is None:
                self._groups[key] = [p]
                self._ranked.clear()
                self._appeared.append(key)
            else:
                bisect.insort(group, p)
        self._keys[p] = key

    def bound(self, key: SourceKey, t_used: int, t_compute: int, hostable: tuple[frozenset[str], ...]) -> int:
        """``PullSearch.removal_bound`` of a GPU with source ``key`` for a target with ``t_used`` of
        ``t_compute`` slices that can host ``hostable``: the best drop among the profiles it can host whose
        jobs are small enough, (U_s C_t - U_t C_s) // (C_s + C_t) clipped to [0, 8] (``_size_cap``)."""
        k, cu, _, drops = key
        c_s, u_s = cu >> 4, cu & 0xF
        cap = min(max((u_s * t_compute - t_used * c_s) // max(c_s + t_compute, 1), 0), 8)
        kid = self._ids.get(key)
        if kid is None:
            kid = self._ids[key] = len(self._ids)
        memo = (kid, hostable, cap)
        got = self._bounds.get(memo)
        if got is None:
            got = 0
            profiles = self._profiles[k]
            for name in hostable[k]:
                col, c = profiles[name]
                if c <= cap and drops[col] < got:
                    got = drops[col]
            if len(self._bounds) >= _MEMO_LIMIT:
                self._bounds.clear()
            self._bounds[memo] = got
        return got

    def heads(self, t_used: int, t_compute: int, hostable: tuple[frozenset[str], ...],
              skip: Container[int] = ()) -> Iterator[Head]:
        """The sources with a bound < 0 for the target, as (bound, -load, position) in increasing order,
        leaving out the positions in ``skip`` (GPUs the plan has changed: the caller bounds them itself)."""
        runs = self._ranked.get((t_used, t_compute, hostable))
        if runs is None:
            runs = self._rank(t_used, t_compute, hostable)
        groups = self._groups
        for b, nl, keys in runs:
            # groups of equal (bound, load) interleave by position
            run: Iterable[int] = groups[keys[0]] if len(keys) == 1 else heapq.merge(*(groups[k] for k in keys))
            for p in run:
                if p not in skip:
                    yield b, nl, p

    def _rank(self, t_used: int, t_compute: int, hostable: tuple[frozenset[str], ...]
              ) -> list[tuple[int, int, list[SourceKey]]]:
        ranked: list[tuple[int, int, SourceKey]] = []
        bounds, ids = self._bounds, self._ids
        for key in self._groups:
            # ``bound`` with its memo look-up inlined: this runs for every group whenever the groups change
            cu = key[1]
            c_s = cu >> 4
            cap = min(max(((cu & 0xF) * t_compute - t_used * c_s) // max(c_s + t_compute, 1), 0), 8)
            kid = ids.get(key)
            b = None if kid is None else bounds.get((kid, hostable, cap))
            if b is None:
                b = self.bound(key, t_used, t_compute, hostable)
            if b < 0:
                ranked.append((b, -key[2], key))
        ranked.sort()
        runs: list[tuple[int, int, list[SourceKey]]] = []
        for b, nl, key in ranked:
            if runs and runs[-1][0] == b and runs[-1][1] == nl:
                runs[-1][2].append(key)
            else:
                runs.append((b, nl, [key]))
        if len(self._ranked) >= _MEMO_LIMIT:
            self._ranked.clear()
        self._ranked[(t_used, t_compute, hostable)] = runs
        return runs

    def sources(self) -> dict[int, SourceKey]:
        """Position -> source key of every candidate source (for tests and invariant checks)."""
        return {p: k for p, k in enumerate(self._keys) if k is not None}
