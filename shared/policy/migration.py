"""The seeds' migration planner: reactive and periodic defragmentation as a list of planned moves.

On a **Busy** GPU (load >= threshold) it plans intra-GPU moves: the move that lowers the GPU's FragCost most,
then again on the updated (virtual) state, while a move still lowers it. On a **Lazy** GPU it pulls one job
from a Busy GPU with a higher load: the job whose removal lowers that source's FragCost most, placed at the
target's best placement (lowest FragCost after), provided the target does not end up more loaded than the
source.

Moves are make-before-break (start on the destination, then stop the source and destroy its instance), so the
destination slices must be free while the source still holds its own: an intra move never overlaps its source.
Idle instances in the destination's way may be destroyed; each move lists them. Moves are ordered: each
assumes the previous ones have completed. A job moves at most once per plan; ``migratable``, the per-job
cooldown and "no inter-GPU move for latency-sensitive jobs" are honoured, and a plan has at most ``max_moves``
moves.

Scores use FragCost over busy instances (idle ones are reclaimable), quantised so that equal costs tie
exactly. Tie-breaks, for reproducibility: intra: larger drop, fewer idle slices destroyed, lower source start,
higher destination start, job id; inter: larger drop at the source, higher source load, source listed first,
lower source start; then, on the target, lowest FragCost after, fewest idle slices destroyed, highest start.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Sequence
from typing import Literal

import msgspec
import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span
from shared.mig.tables import tables_for
from shared.policy.consolidate import consolidate
from shared.policy.migration_search import (
    VirtualGpu,
    move_bounds,
    removal_bound,
    shape_target,
)
from shared.policy.snapshot import ClusterSnapshot, InstanceView

IntraMove = tuple[tuple[int, int, int, int, str], InstanceView, Profile, int]
"""(key: change, idle slices destroyed, source start, -destination start, job; instance; profile; start)."""
SourceJob = tuple[tuple[int, int, int, int], str, InstanceView]
"""(key: source change, -source load, source position, start; source GPU id; instance)."""


class MigrationParams(msgspec.Struct, frozen=True, kw_only=True):
    threshold: float = 0.4
    """Lazy/Busy threshold on load (used / total compute slices), the balancer's ``t``."""
    cooldown_s: float = 120.0
    """A job moved less than this long ago is not moved again."""
    max_moves: int = 4
    """Most moves in one plan (one call)."""
    intra: bool = True
    inter: bool = True
    pull_into_empty: bool = True
    consolidate: bool = False
    """After an exit leaves a Lazy GPU with a few jobs, move all of them onto GPUs that already run jobs so it
    becomes empty for a whole-GPU job (``shared.policy.consolidate``), before any pull into it."""
    """Whether an inter move may target a GPU with no job. The seeds pull into any Lazy GPU, which spreads
    jobs onto empty GPUs and costs the whole-GPU jobs that dominate real traces their room; False pulls only
    into partly used Lazy GPUs (filling their holes) and keeps empty GPUs empty."""


class Move(msgspec.Struct, frozen=True, kw_only=True):
    """One planned job move. ``expected_change`` < 0 means FragCost drops (intra: the GPU's; inter: the
    source's). The source instance is released after the hand-over; ``destroy`` lists the idle instances on
    the destination that are in the way and must be destroyed first."""

    job_id: str
    kind: Literal["intra", "inter"]
    src_gpu: str
    src_instance: str
    src_profile: str
    src_start: int
    dst_gpu: str
    dst_profile: str
    dst_start: int
    dst_size: int
    destroy: tuple[str, ...]
    frag_src_before: float
    frag_src_after: float
    frag_dst_before: float
    frag_dst_after: float
    expected_change: float
    reason: str


class _Plan:
    def __init__(self, snap: ClusterSnapshot, now: float, params: MigrationParams) -> None:
        self.snap = snap
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

        # sources() depends only on the snapshot and the moves planned so far: cache it per move count
        # (plan_defrag asks once per Lazy GPU, which made a tick quadratic in the GPU count)
        self._sources: tuple[int, list[SourceJob]] | None = None
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
            intra = np.concatenate([move_bounds(m)[1] for m in snap.model_list] or [np.zeros(0, np.int64)])
            self._cols = (load_q, ok, idx * 9, intra[idx])
            self._removal = removal
        return self._cols

    def load_ok(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """The first two of ``columns()``, alone: a pull needs only them, the bounds are for the tick."""
        if self._load_ok is None:
            # columns the snapshot builder keeps (derived once for a hand-built snapshot)
            load_q = self.snap.load_q
            self._load_ok = (load_q, (load_q >= self.t_q) & self.snap.ok)
        return self._load_ok

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
        sig = tuple((i.profile, i.start, i.busy) for i in t.insts)
        return _hostable(self.snap.model_list, t.model, sig)

    def removal_bound_of(self, g: VirtualGpu, t: VirtualGpu) -> int:
        cmax = (g.used * t.compute - t.used * g.compute) // max(g.compute + t.compute, 1)
        return int(removal_bound(g.model, t.model)[g.busy_mask * 9 + min(max(cmax, 0), 8)])

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

    # -- intra -------------------------------------------------------------------------------------------

    def best_intra(self, g: VirtualGpu) -> IntraMove | None:
        busy = g.busy_mask
        before = g.cost_q(busy)
        best: IntraMove | None = None
        for inst in g.insts:
            if not self.may_move(inst, inter=False) or not g.model.has_profile(inst.profile):
                continue
            prof = g.model.profile(inst.profile)
            base = busy & ~inst.mask
            for s in prof.placements:
                pm = span(prof.memory_slices, s)
                # make-before-break: the source's own slices are still busy while the copy starts
                if pm & busy or not g.count_ok(prof, pm):
                    continue
                change = g.cost_q(base | pm) - before
                if change >= 0:
                    continue
                ov = sum(i.size for i in g.in_the_way(pm))
                key = (change, ov, inst.start, -s, inst.job_id or "")
                if best is None or key < best[0]:
                    best = (key, inst, prof, s)
        return best

    def apply_intra(self, g: VirtualGpu, found: IntraMove,
                    why: str) -> None:
        _, inst, prof, s = found
        pm = span(prof.memory_slices, s)
        busy = g.busy_mask
        destroy = tuple(i.id for i in g.in_the_way(pm))
        fb, fa = g.tables.cost(busy), g.tables.cost((busy & ~inst.mask) | pm)
        self.moves.append(Move(
            job_id=inst.job_id or "", kind="intra", src_gpu=g.id, src_instance=inst.id,
            src_profile=inst.profile, src_start=inst.start, dst_gpu=g.id, dst_profile=prof.name, dst_start=s,
            dst_size=prof.memory_slices,
            destroy=destroy, frag_src_before=fb, frag_src_after=fa, frag_dst_before=fb, frag_dst_after=fa,
            expected_change=fa - fb,
            reason=f"{why}: {inst.profile}@{inst.start}->@{s} lowers FragCost {fb:.3f}->{fa:.3f}",
        ))
        self.moved.add(inst.job_id or "")
        g.take(inst)
        g.put(prof, s, inst, self.now)
        self._gpus[g.id] = g
        self.changed(g)

    def intra_on(self, g: VirtualGpu, why: str) -> None:
        while not self.full():
            found = self.best_intra(g)
            if found is None:
                return
            self.apply_intra(g, found, why)

    # -- inter -------------------------------------------------------------------------------------------

    def sources(self) -> list[SourceJob]:
        """Every movable job on a Busy GPU whose removal lowers that GPU's FragCost, best drop first.

        Untouched GPUs are screened on the snapshot's columns; only GPUs already changed by this plan are read
        from the virtual state.
        """
        if self._sources is not None and self._sources[0] == len(self.moves):
            return self._sources[1]
        snap = self.snap
        load_q = np.rint(snap.used.astype(np.float64) * 1000.0 / np.maximum(snap.compute, 1))
        ok = (load_q >= self.t_q) & np.asarray(snap.mig, dtype=bool) & np.asarray(snap.healthy, dtype=bool)
        found: list[SourceJob] = []
        touched = self._changed
        insts: Sequence[InstanceView]
        for pos in sorted(set(np.flatnonzero(ok).tolist()) | touched.keys()):
            g = touched.get(pos)
            if g is not None:
                if not self.busy_tier(g):
                    continue
                insts, busy, lq, table = g.insts, g.busy_mask, g.load_q(), g.tables.fragcost_q
            else:
                view = snap.gpus[pos]
                insts, busy, lq = view.instances, view.busy_mask, int(load_q[pos])
                table = tables_for(self.model_at(pos)).fragcost_q
            before = int(table[busy])
            for inst in insts:
                if not self.may_move(inst, inter=True):
                    continue
                change = int(table[busy & ~inst.mask]) - before
                if change < 0:
                    found.append(((change, -lq, pos, inst.start), snap.gpus[pos].id, inst))
        found.sort(key=lambda f: f[0])
        self._sources = (len(self.moves), found)
        return found

    def dst_placement(self, t: VirtualGpu, src: Profile) -> tuple[Profile, int] | None:
        """The target's profile of the source's shape (never less memory, unless the same name) and its best
        start: lowest FragCost after, fewest idle slices destroyed, highest start."""
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
        load_q = self.load_ok()[0]
        touched = self._changed
        hostable = self.hostable(t)
        if not any(hostable):
            return None  # no profile has a place on the target: nothing can be pulled
        removal = self.removal_bound(t, hostable)
        mask = removal < 0
        if touched:
            mask[list(touched)] = False
        pos = np.flatnonzero(mask)
        order = pos[np.lexsort((pos, -load_q[pos], removal[pos]))]
        extra = []
        for p, g in touched.items():
            if self.busy_tier(g):
                b = self.removal_bound_of(g, t)
                if b < 0:
                    extra.append((b, -g.load_q(), p))
        extra.sort()
        best: tuple[tuple[int, int, int, int], str, InstanceView, Profile, int] | None = None
        i = j = 0
        while i < order.size or j < len(extra):
            if j < len(extra) and (i >= order.size or extra[j] < (int(removal[order[i]]),
                                                                   -int(load_q[order[i]]), int(order[i]))):
                head, j = extra[j], j + 1
            else:
                p = int(order[i])
                head, i = (int(removal[p]), -int(load_q[p]), p), i + 1
            if best is not None and head > best[0][:3]:
                break
            for key, src_id, inst in self._jobs_at(head[2], touched.get(head[2])):
                if best is not None and key >= best[0]:
                    break
                dst = self._dst_for(t, src_id, inst)
                if dst is not None:
                    best = (key, src_id, inst, dst[0], dst[1])
                    break
        return None if best is None else best[1:]

    def _jobs_at(self, pos: int, g: VirtualGpu | None) -> list[SourceJob]:
        """The movable jobs of one GPU whose removal lowers its FragCost, as sources() keys them."""
        view = self.snap.gpus[pos]
        insts: Sequence[InstanceView]
        if g is not None:
            insts, busy, lq, table = g.insts, g.busy_mask, g.load_q(), g.tables.fragcost_q
        else:
            insts, busy, lq = view.instances, view.busy_mask, int(self.load_ok()[0][pos])
            table = tables_for(self.model_at(pos)).fragcost_q
        before = int(table[busy])
        out = []
        for inst in insts:
            if self.may_move(inst, inter=True):
                change = int(table[busy & ~inst.mask]) - before
                if change < 0:
                    out.append(((change, -lq, pos, inst.start), view.id, inst))
        out.sort(key=lambda f: f[0])
        return out

    def pull_into(self, t: VirtualGpu, why: str, exhaustive: bool = False) -> bool:
        """Plan one pull into Lazy ``t``. ``exhaustive`` scans the full source list (the reference the
        best-first search is tested against)."""
        if self.full() or self.busy_tier(t):
            return False
        if not self.params.pull_into_empty and t.busy_mask == 0:
            return False
        found: tuple[str, InstanceView, Profile, int] | None = None
        if exhaustive:
            for _, src_id, inst in self.sources():
                dst = self._dst_for(t, src_id, inst)
                if dst is not None:
                    found = (src_id, inst, dst[0], dst[1])
                    break
        else:
            found = self.best_pull(t)
        if found is None:
            return False
        src_id, inst, prof, start = found
        self.apply_inter(self.gpu(src_id), inst, t, prof, start, why)
        return True

    def apply_inter(
        self, src: VirtualGpu, inst: InstanceView, t: VirtualGpu, prof: Profile, s: int, why: str
    ) -> None:
        pm = span(prof.memory_slices, s)
        sb, tb = src.busy_mask, t.busy_mask
        fsb, fsa = src.tables.cost(sb), src.tables.cost(sb & ~inst.mask)
        fdb, fda = t.tables.cost(tb), t.tables.cost(tb | pm)
        self.moves.append(Move(
            job_id=inst.job_id or "", kind="inter", src_gpu=src.id, src_instance=inst.id,
            src_profile=inst.profile, src_start=inst.start, dst_gpu=t.id, dst_profile=prof.name, dst_start=s,
            dst_size=prof.memory_slices, destroy=tuple(i.id for i in t.in_the_way(pm)),
            frag_src_before=fsb, frag_src_after=fsa, frag_dst_before=fdb, frag_dst_after=fda,
            expected_change=fsa - fsb,
            reason=(f"{why}: {inst.profile} from busy {src.id} (FragCost {fsb:.3f}->{fsa:.3f}) "
                    f"to lazy {t.id} {prof.name}@{s}"),
        ))
        self.moved.add(inst.job_id or "")
        src.take(inst)
        t.put(prof, s, inst, self.now)
        for g in (src, t):
            self._gpus[g.id] = g
            self.changed(g)


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


@functools.lru_cache(maxsize=65536)
def _hostable(
    models: tuple[GpuModel, ...], target: GpuModel, insts: tuple[tuple[str, int, bool], ...]
) -> tuple[frozenset[str], ...]:
    """``_Plan.hostable`` for a target holding ``insts`` (profile, start, busy): per source model, the
    profiles whose target shape has a start free of busy slices with room under its max count. Cached
    across plans: a cluster shows few distinct GPU states, and every pull asks."""
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


def plan_after_exit(
    snap: ClusterSnapshot, gpu_id: str, now: float, params: MigrationParams
) -> tuple[Move, ...]:
    """Moves to make after a job left ``gpu_id`` (the snapshot already shows it gone).

    Busy GPU: intra-GPU moves, best first, while they lower its FragCost. Lazy GPU: pull one job from a Busy
    GPU with a higher load. An unknown, unhealthy or non-MIG GPU gets no moves.
    """
    plan = _Plan(snap, now, params)
    if params.max_moves <= 0 or not plan.usable(gpu_id):
        return ()
    g = plan.gpu(gpu_id)
    if plan.busy_tier(g):
        if params.intra:
            plan.intra_on(g, "after exit, busy GPU")
    elif params.consolidate and g.busy_mask and consolidate(plan, g, "after exit, consolidate"):
        return tuple(plan.moves)
    elif params.inter:
        plan = _Plan(snap, now, params)  # a failed consolidation leaves nothing behind
        plan.pull_into(plan.gpu(gpu_id), "after exit, lazy GPU")
    return tuple(plan.moves)


def plan_defrag(snap: ClusterSnapshot, now: float, params: MigrationParams) -> tuple[Move, ...]:
    """The periodic defragmentation over all GPUs, at most ``params.max_moves`` moves in all.

    First intra moves on Busy GPUs, always the largest FragCost drop in the cluster next; then one pull into
    each Lazy GPU, least loaded first (snapshot order breaks ties). GPUs are searched best bound first, so a
    tick over thousands of GPUs looks at few of them closely.
    """
    plan = _Plan(snap, now, params)
    if params.max_moves <= 0 or len(snap) == 0:
        return ()
    load_q, busy_ok, _, intra_bound = plan.columns()
    if params.intra:
        heap = [(int(intra_bound[p]), int(p)) for p in np.flatnonzero(busy_ok & (intra_bound < 0))]
        heapq.heapify(heap)
        found: dict[int, IntraMove | None] = {}
        while not plan.full():
            cur = min(((f[0], p) for p, f in found.items() if f is not None), default=None)
            # a GPU whose bound cannot beat the best move found so far need not be looked at
            while heap and (cur is None or heap[0][0] <= cur[0][0]):
                _, p = heapq.heappop(heap)
                f = found[p] = plan.best_intra(plan.peek(p))
                if f is not None and (cur is None or (f[0], p) < cur):
                    cur = (f[0], p)
            if cur is None:
                break
            p = cur[1]
            g = plan.peek(p)
            move = found[p]
            assert move is not None
            plan.apply_intra(g, move, "defragmentation, busy GPU")
            found[p] = plan.best_intra(g)
    if params.inter and not plan.full():
        usable = np.asarray(snap.mig, dtype=bool) & np.asarray(snap.healthy, dtype=bool)
        lazy = usable & (load_q < plan.t_q)
        for p in list(plan._changed):
            lazy[p] = usable[p] and not plan.busy_tier(plan._changed[p])
        order = np.flatnonzero(lazy)
        loads = np.array([plan.peek(int(p)).load_q() if int(p) in plan._changed else load_q[p]
                          for p in order], dtype=np.int64)
        targets = order[np.lexsort((order, loads))] if order.size else order
        failed: tuple[int, set[object]] = (len(plan.moves), set())
        # an untouched GPU's instance set is given by its columns, so that skipping a GPU identical to one
        # that failed is a look-up, not a walk over its instances
        pair, busy_starts, idle_starts = snap.pair, snap.busy_starts, snap.idle_starts
        exists: tuple[int, bool] = (-1, False)
        for p in targets.tolist():
            if exists[0] != len(plan.moves):  # sources change only when a move is planned
                exists = (len(plan.moves), plan.sources_exist())
            if plan.full() or not exists[1]:
                break
            if failed[0] != len(plan.moves):
                failed = (len(plan.moves), set())
            if p in plan._changed:
                t = plan.peek(p)
                sig: object = (t.model.name, t.busy_mask,
                               tuple((i.profile, i.start, i.busy) for i in t.insts))
            else:
                sig = (int(pair[p]), busy_starts[p].tobytes(), idle_starts[p].tobytes())
            if sig in failed[1]:
                continue  # an identical GPU found nothing to pull since the last move
            t = plan.peek(p)
            if not plan.pull_into(t, "defragmentation, lazy GPU"):
                failed[1].add(sig)
    return tuple(plan.moves)
