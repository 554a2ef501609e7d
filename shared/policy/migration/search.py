"""The migration planner's search aids: the virtual state of one GPU while a plan is built, and per-model
lower bounds of what one move can gain, so the planner searches GPUs best-first and stops early."""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span
from shared.mig.tables import ModelTables, tables_for
from shared.policy.snapshot import GpuView, InstanceView


def shape_target(src: Profile, target: GpuModel) -> Profile | None:
    """The profile a job on ``src`` takes on ``target``: the same shape, never less memory unless it is the
    same profile name (the job's request is not in the snapshot, so its memory need is the source's)."""
    got = _SHAPES.get((id(src), id(target)))
    if got is not None and got[0] is src and got[1] is target:
        return got[2]
    prof = next((p for p in target.profiles if p.shape == src.shape), None)
    if prof is not None and prof.name != src.name and prof.memory_gib + 1e-9 < src.memory_gib:
        prof = None
    _SHAPES[(id(src), id(target))] = (src, target, prof)
    return prof


# Memos keyed by identity: hashing a GpuModel (a frozen struct of every profile) costs about 0.5 µs, more
# than the look-ups they save. Each entry keeps its keys referenced, so an id is never reused while cached.
_SHAPES: dict[tuple[int, int], tuple[Profile, GpuModel, Profile | None]] = {}
_TABLES: dict[int, tuple[GpuModel, ModelTables]] = {}


def tables_of(model: GpuModel) -> ModelTables:
    """``tables_for(model)``, looked up by identity (see ``_TABLES``)."""
    got = _TABLES.get(id(model))
    if got is None or got[0] is not model:
        got = _TABLES[id(model)] = (model, tables_for(model))
    return got[1]


@functools.cache
def removal_bound(model: GpuModel, target: GpuModel | None) -> npt.NDArray[np.int64]:
    """Per ``busy * 9 + c``: the most negative quantised FragCost change that taking one instance of at
    most ``c`` compute slices off a GPU of ``model`` can bring, counting only profiles that have a place on
    ``target`` (all when None). A lower bound of what the real jobs allow: GPUs are searched best-first by it
    and the search stops once no bound can beat the best move found."""
    names = frozenset(p.name for p in model.profiles if target is None or shape_target(p, target) is not None)
    return removal_bound_among(model, names)


@functools.cache
def removal_bound_among(model: GpuModel, names: frozenset[str]) -> npt.NDArray[np.int64]:
    """``removal_bound`` counting only the profiles named: those a given target can host right now, which
    makes the bound tight enough that a pull into a nearly full target stops after a few GPUs instead of
    visiting every Busy one (the planner's hot spot at 1,000 GPUs)."""
    cost = tables_for(model).fragcost_q
    masks = np.arange(256, dtype=np.int64)
    removal = np.zeros((256, 9), dtype=np.int64)
    for p in model.profiles:
        if p.name not in names:
            continue
        for s in p.placements:
            pm = span(p.memory_slices, s)
            drop = np.where((masks & pm) == pm, cost[masks & ~pm] - cost[masks], 0)
            removal[:, p.compute_slices:] = np.minimum(removal[:, p.compute_slices:], drop[:, None])
    flat = removal.reshape(-1)
    flat.setflags(write=False)
    return flat


@functools.cache
def removal_by_starts(model: GpuModel, profile: str) -> npt.NDArray[np.int64]:
    """Per ``busy << 8 | starts`` (a bit per start of a busy ``profile`` instance, the snapshot's
    ``busy_starts``): the most negative quantised FragCost change that taking one of those instances off
    brings, 0 if none lowers it. Exact per GPU (unlike ``removal_bound``, which only sees the busy mask)."""
    cost = tables_for(model).fragcost_q
    size = model.profile(profile).memory_slices
    pairs = np.arange(256 * 256, dtype=np.int64)
    busy, starts = pairs >> 8, pairs & 0xFF
    out = np.zeros(pairs.size, dtype=np.int64)
    for s in range(model.memory_slices - size + 1):
        pm = span(size, s)
        drop = cost[busy & ~pm] - cost[busy]
        out = np.where(((starts >> s) & 1).astype(bool), np.minimum(out, drop), out)
    out.setflags(write=False)
    return out


@functools.cache
def intra_by_starts(model: GpuModel, profile: str) -> npt.NDArray[np.int64]:
    """Per ``busy << 8 | starts`` (a bit per start of a busy ``profile`` instance, the snapshot's
    ``busy_starts``): the most negative quantised FragCost change that moving one of those instances to
    another placement of its profile on the same GPU brings, 0 if none lowers it. Make-before-break, as
    ``best_intra``: the new placement must be free of every busy slice, the instance's own included. A lower
    bound of ``best_intra`` (which also needs a movable job, no cooldown and room under the max count)."""
    cost = tables_for(model).fragcost_q
    prof = model.profile(profile)
    size = prof.memory_slices
    pairs = np.arange(256 * 256, dtype=np.int64)
    busy, starts = pairs >> 8, pairs & 0xFF
    out = np.zeros(pairs.size, dtype=np.int64)
    for s in range(8):
        held = ((starts >> s) & 1).astype(bool)
        base = busy & ~span(size, s)
        for s2 in prof.placements:
            pm2 = span(size, s2)
            ok = held & ((busy & pm2) == 0)
            out = np.where(ok, np.minimum(out, cost[(base | pm2) & 0xFF] - cost[busy]), out)
    out.setflags(write=False)
    return out


@functools.cache
def move_bounds(model: GpuModel) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(removal bound for any target, see ``removal_bound``; per busy mask, the most negative change one
    intra-GPU move can bring)."""
    cost = tables_for(model).fragcost_q
    masks = np.arange(256, dtype=np.int64)
    intra = np.zeros(256, dtype=np.int64)
    for p in model.profiles:
        for s in p.placements:
            pm = span(p.memory_slices, s)
            holds = (masks & pm) == pm
            base = masks & ~pm
            for s2 in p.placements:
                pm2 = span(p.memory_slices, s2)
                ok = holds & ((masks & pm2) == 0)
                intra = np.where(ok, np.minimum(intra, cost[(base | pm2) & 0xFF] - cost[masks]), intra)
    intra.setflags(write=False)
    return removal_bound(model, None), intra


class VirtualGpu:
    """The planner's mutable copy of one GPU, updated as moves are planned (the virtual state)."""

    __slots__ = ("_busy", "_sig", "_used", "compute", "insts", "model", "pos", "tables", "view")

    def __init__(self, view: GpuView, model: GpuModel, pos: int) -> None:
        self.view = view
        self.model = model
        self.pos = pos
        self.tables: ModelTables = tables_of(model)
        self.insts: list[InstanceView] = list(view.instances)
        self.compute = model.compute_slices
        self._busy = -1
        """Busy mask of ``insts`` (-1: not counted since they last changed); ``_used`` likewise."""
        self._used = -1
        self._sig: tuple[tuple[str, int, bool], ...] | None = None

    @property
    def id(self) -> str:
        return self.view.id

    def _count(self) -> None:
        # asked many times per plan (tiers, bounds, placements) between few changes: count once per change
        busy = used = 0
        for i in self.insts:
            if i.job_id is not None:
                busy |= i.mask
                used += i.compute
        self._busy, self._used = busy, used

    def signature(self) -> tuple[tuple[str, int, bool], ...]:
        """(profile, start, busy) per instance: with the model, everything a placement on this GPU depends
        on (an instance's size is its profile's)."""
        if self._sig is None:
            self._sig = tuple((i.profile, i.start, i.job_id is not None) for i in self.insts)
        return self._sig

    @property
    def busy_mask(self) -> int:
        if self._busy < 0:
            self._count()
        return self._busy

    @property
    def used(self) -> int:
        if self._used < 0:
            self._count()
        return self._used

    def load_q(self) -> int:
        return round(self.used * 1000 / max(self.compute, 1))

    def cost_q(self, mask: int) -> int:
        return int(self.tables.fragcost_q[mask])

    def in_the_way(self, pm: int) -> list[InstanceView]:
        return [i for i in self.insts if not i.busy and i.mask & pm]

    def count_ok(self, prof: Profile, pm: int) -> bool:
        """Room for one more ``prof`` at ``pm`` while every other instance of it (the source too) exists."""
        n = sum(1 for i in self.insts if i.profile == prof.name and not (not i.busy and i.mask & pm))
        return n + 1 <= prof.max_count

    def take(self, inst: InstanceView) -> None:
        self.insts = [i for i in self.insts if i.id != inst.id]
        self._busy = self._used = -1
        self._sig = None

    def put(self, prof: Profile, start: int, job: InstanceView, now: float) -> None:
        pm = span(prof.memory_slices, start)
        self.insts = [i for i in self.insts if i.busy or not i.mask & pm]
        self._busy = self._used = -1
        self._sig = None
        self.insts.append(
            InstanceView(
                id=f"{self.id}:{prof.name}@{start}:move:{job.job_id}", profile=prof.name, start=start,
                size=prof.memory_slices, compute=prof.compute_slices, job_id=job.job_id,
                migratable=job.migratable, latency_sensitive=job.latency_sensitive, priority=job.priority,
                tenant=job.tenant, last_moved_at=now, started_at=job.started_at,
            )
        )
