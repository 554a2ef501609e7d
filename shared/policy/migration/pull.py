"""The planner's pull search: which job to pull from a Busy GPU into a Lazy target.

Untouched GPUs are screened on the snapshot's columns with lower bounds of what removing one of their jobs
gains (``removal_bound``), GPUs are visited best bound first and the search stops once no bound can beat the
best pull found (``tests/reference_migration.py`` is the exhaustive scan it is tested against).
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span
from shared.mig.tables import tables_for
from shared.policy.migration.memos import PlannerMemos
from shared.policy.migration.moves import SourceJob
from shared.policy.migration.pull_index import Head
from shared.policy.migration.search import VirtualGpu, removal_bound, shape_target, tables_of
from shared.policy.migration.state import PlanState
from shared.policy.snapshot import GpuView, InstanceView


class PullSearch(PlanState):
    """The pull search over a plan's state."""

    def removal_bound(self, t: VirtualGpu, hostable: tuple[frozenset[str], ...] | None = None
                      ) -> npt.NDArray[np.int64]:
        """Per GPU (columns): the best FragCost drop among the jobs it really holds that ``t`` can host and
        that are small enough to move to ``t`` without leaving ``t`` more loaded than the source, i.e.
        c <= (U_s C_t - U_t C_s) / (C_s + C_t). A lower bound (it ignores cooldowns and the like)."""
        if self._every is None:
            self._every = np.arange(len(self.snap))
        every = self._every
        cmax = _size_cap(t.used, t.compute)[self.snap.cu_idx]
        hostable = self.hostable(t) if hostable is None else hostable
        by_c = self._by_c.get(hostable)
        if by_c is not None:
            return by_c[cmax, every]
        if hostable in self._asked:
            # asked again in this plan (a defragmentation tick tries many targets): tabulate per size once
            by_c = np.zeros((9, cmax.size), dtype=np.int64)
            for k, (m, names) in enumerate(zip(self.snap.model_list, hostable, strict=True)):
                for name in names:
                    c = m.profile(name).compute_slices
                    by_c[c:] = np.minimum(by_c[c:], self._drops_of(k, m, name))
            self._by_c[hostable] = by_c
            return by_c[cmax, every]
        self._asked.add(hostable)
        # first time (the common case after an exit: one target per plan): only the sizes that can move.
        # A GPU that is no usable Busy source of model k gets size cap -1, so that no profile counts there:
        # the same as masking each drop column (``_drops_of``), in one operation per model.
        bound = np.zeros(cmax.size, dtype=np.int64)
        snap = self.snap
        single = len(snap.model_list) == 1
        for k, (m, names) in enumerate(zip(snap.model_list, hostable, strict=True)):
            if not names:
                continue
            ok = self.load_ok()[1] if single else self.load_ok()[1] & (np.asarray(snap.model_idx) == k)
            cap = np.where(ok, cmax, -1)
            top = int(cap.max()) if cap.size else -1
            index = tables_for(m).index
            for name in names:
                c = m.profile(name).compute_slices
                if c <= top:
                    np.minimum(bound, snap.movable_drops[:, index[name]], out=bound, where=cap >= c)
        return bound

    def _drops_of(self, k: int, m: GpuModel, name: str) -> npt.NDArray[np.int64]:
        """Per GPU: the best FragCost drop among the busy ``name`` instances it holds that may move to
        another GPU (0 if none, or not a usable Busy GPU of model ``k``). Independent of the target: computed
        once per plan and profile."""
        vals = self._drops.get((k, name))
        if vals is None:
            snap = self.snap
            ok = self.load_ok()[1]
            # only jobs that may leave their GPU at all (``removal_by_starts`` over ``movable_starts``, kept by
            # the snapshot builder): a tighter bound than every busy instance, still a lower bound (cooldowns
            # are not counted), so the best-first search finds the same move sooner
            vals = snap.movable_drops[:, tables_for(m).index[name]]
            if len(snap.model_list) > 1:
                ok = ok & (np.asarray(snap.model_idx) == k)
            vals = np.where(ok, vals, 0)
            self._drops[(k, name)] = vals
        return vals

    def hostable(self, t: VirtualGpu) -> tuple[frozenset[str], ...]:
        """Per snapshot model: the source profiles that have a destination placement on ``t`` now. Exact
        (``dst_placement`` does not depend on the source), so bounds over them skip only impossible moves."""
        return hostable_on(self.memos, self.snap.model_list, t.model, t.signature(), self._model_ids)

    def removal_bound_of(self, g: VirtualGpu, t: VirtualGpu) -> int:
        cmax = (g.used * t.compute - t.used * g.compute) // max(g.compute + t.compute, 1)
        return int(removal_bound(g.model, t.model)[g.busy_mask * 9 + min(max(cmax, 0), 8)])

    def sources_exist(self) -> bool:
        """Cheap screen: can any GPU be a source at all?"""
        _, ok, base, _ = self.columns()
        if bool((ok & (self._removal[base + 8] < 0)).any()):
            return True
        return any(self.busy_tier(g) for g in self._changed.values())

    def _dst_for(self, t: VirtualGpu, src_id: str, inst: InstanceView) -> tuple[Profile, int] | None:
        """Where ``inst`` would go on target ``t``, or None when the move is not allowed there."""
        if src_id == t.id:
            return None
        src = self.gpu(src_id)
        if not src.model.has_profile(inst.profile):
            return None
        sprof = src.model.profile(inst.profile)
        c = sprof.compute_slices
        # the target must not end up more loaded than the source (no ping-pong)
        if (t.used + c) * src.compute > (src.used - c) * t.compute:
            return None
        return self.dst_placement(t, sprof)

    def best_pull(self, t: VirtualGpu) -> tuple[str, InstanceView, Profile, int] | None:
        """The allowed pull into ``t`` with the smallest (source change, -source load, source position,
        start): GPUs are visited best bound first and the search stops once no bound can beat the best."""
        touched = self._changed
        hostable = self.hostable(t)
        if not any(hostable):
            return None  # no profile has a place on the target: nothing can be pulled
        pulls = self.pulls
        heads: Iterator[Head]
        if (pulls is not None and pulls.snapshot is self.snap and pulls.t_q == self.t_q
                and pulls.describes(self.now, self.params.cooldown_s)):
            # the same heads, from the caller's incremental index (shared.policy.migration.pull_index); in its cooldown
            # mode, those of them with a pullable job, bounds no smaller: the same pull, found sooner
            heads = pulls.heads(t.used, t.compute, hostable, touched)
        else:
            heads = self._column_heads(t, hostable)
        extra = []
        for p, g in touched.items():
            if self.busy_tier(g):
                b = self.removal_bound_of(g, t)
                if b < 0:
                    extra.append((b, -g.load_q(), p))
        extra.sort()
        best: tuple[tuple[int, int, int, int], str, InstanceView, Profile, int] | None = None
        for head in heapq.merge(heads, extra) if extra else heads:
            if best is not None and head > best[0][:3]:
                break
            for key, src_id, inst in self._jobs_at(head[2], touched.get(head[2]), head[1]):
                if best is not None and key >= best[0]:
                    break
                dst = self._dst_for(t, src_id, inst)
                if dst is not None:
                    best = (key, src_id, inst, dst[0], dst[1])
                    break
        return None if best is None else best[1:]

    def _column_heads(self, t: VirtualGpu, hostable: tuple[frozenset[str], ...]) -> Iterator[Head]:
        """(bound, -load, position) of every untouched GPU with a bound < 0, in increasing order, from the
        snapshot's columns."""
        load_q = self.load_ok()[0]
        removal = self.removal_bound(t, hostable)
        mask = removal < 0
        if self._changed:
            mask[list(self._changed)] = False
        pos = np.flatnonzero(mask)
        order = pos[np.lexsort((pos, -load_q[pos], removal[pos]))]
        return zip(removal[order].tolist(), (-load_q[order]).tolist(), order.tolist(), strict=True)

    def _jobs_at(self, pos: int, g: VirtualGpu | None, nlq: int) -> list[SourceJob]:
        """The movable jobs of one GPU whose removal lowers its FragCost, as sources() keys them. ``nlq``: its
        head's -load (the snapshot's ``load_q``, handed on so that the column need not be read)."""
        view = self.snap.gpus[pos]
        if g is None:
            return self._view_jobs_at(pos, view, nlq)
        insts, busy, lq, table = g.insts, g.busy_mask, g.load_q(), g.tables.fragcost_q
        before = int(table[busy])
        out = []
        for inst in insts:
            if self.may_move(inst, inter=True):
                change = int(table[busy & ~inst.mask]) - before
                if change < 0:
                    out.append(((change, -lq, pos, inst.start), view.id, inst))
        out.sort(key=lambda f: f[0])
        return out

    def _view_jobs_at(self, pos: int, view: GpuView, nlq: int) -> list[SourceJob]:
        """``_jobs_at`` of a GPU the plan has not changed. Which of its jobs may leave it and what removing
        each gains depend on the (immutable) view alone, so they are memoised per view across plans; only
        the plan's moved set and the cooldowns are checked per call."""
        model = self.model_at(pos)
        jobs = self.memos.view_jobs.get(view, model)
        if jobs is None:
            table = tables_of(model).fragcost_q
            busy = view.busy_mask
            before = int(table[busy])
            jobs = []
            for inst in view.instances:
                if inst.busy and inst.migratable and not inst.latency_sensitive:
                    change = int(table[busy & ~inst.mask]) - before
                    if change < 0:
                        jobs.append((change, inst.start, inst))
            jobs.sort(key=lambda f: (f[0], f[1]))
            self.memos.view_jobs.put(view, model, jobs)
        moved, now, cooldown = self.moved, self.now, self.params.cooldown_s
        return [((change, nlq, pos, start), view.id, inst) for change, start, inst in jobs
                if inst.job_id not in moved and now - inst.last_moved_at >= cooldown]


@functools.lru_cache(maxsize=4096)
def _size_cap(t_used: int, t_compute: int) -> npt.NDArray[np.int64]:
    """Per source ``compute << 4 | used`` (the snapshot's ``cu_idx``): the largest job, in compute slices,
    that may move to a target with ``t_used`` of ``t_compute`` slices without leaving it more loaded than
    the source, ``(U_s C_t - U_t C_s) // (C_s + C_t)`` clipped to [0, 8] (``removal_bound``)."""
    idx = np.arange(256, dtype=np.int64)
    c_s, u_s = idx >> 4, idx & 0xF
    cap = np.minimum(np.maximum((u_s * t_compute - t_used * c_s) // np.maximum(c_s + t_compute, 1), 0), 8)
    cap.setflags(write=False)
    return cap


def hostable_on(memos: PlannerMemos, models: tuple[GpuModel, ...], target: GpuModel,
                sig: tuple[tuple[str, int, bool], ...], model_ids: tuple[int, ...] | None = None
                ) -> tuple[frozenset[str], ...]:
    """``PullSearch.hostable`` of a target of model ``target`` whose ``VirtualGpu.signature`` is ``sig``, for a
    snapshot whose model list is ``models`` (``model_ids``: their ids, when the caller has them at hand),
    through ``memos.hostable``: a cluster shows few distinct GPU states, and every pull asks."""
    key = (tuple(id(m) for m in models) if model_ids is None else model_ids, id(target), sig)
    got = memos.hostable.get(key)
    if got is None:
        got = (target, models, _hostable(models, target, sig))
        memos.hostable.put(key, got)
    return got[2]


def _hostable(
    models: tuple[GpuModel, ...], target: GpuModel, insts: tuple[tuple[str, int, bool], ...]
) -> tuple[frozenset[str], ...]:
    """``_Plan.hostable`` for a target holding ``insts`` (profile, start, busy): per source model, the
    profiles whose target shape has a start free of busy slices with room under its max count."""
    busy = 0
    for name, start, b in insts:
        if b:
            busy |= span(target.profile(name).memory_slices, start)
    out = []
    for m in models:
        names = set()
        for p in m.profiles:
            prof = shape_target(p, target)
            if prof is None:
                continue
            for st in prof.placements:
                pm = span(prof.memory_slices, st)
                if pm & busy:
                    continue
                # VirtualGpu.count_ok: instances of the profile that stay (busy, or idle and not in the way)
                n = sum(1 for name, s0, b in insts if name == prof.name
                        and (b or not span(prof.memory_slices, s0) & pm))
                if n + 1 <= prof.max_count:
                    names.add(p.name)
                    break
        out.append(frozenset(names))
    return tuple(out)
