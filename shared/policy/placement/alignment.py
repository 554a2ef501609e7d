"""The keys of the ``migsched`` placement rule (``shared.policy.placement.plugins.migsched``): one int64 per
GPU, lower is better, so a decision over thousands of GPUs is a few gathers and one argmin.

A key packs, most significant first (``FIELDS``): the tier (empty GPU opened, or the GPU's load while empty GPUs
are plenty), the load again with ``spread``, the FragCost increase in steps of ``1 / fit_steps``, the job's
extension of the GPU's and of the node's expected busy time (``bucket``), reuse before create, FragCost after,
idle slices destroyed, the node's empty GPUs, the fullest GPU, the highest start. Within one GPU only the
*static* fields differ between its candidate starts (increase, action, cost, destroyed, start), and they depend
only on the GPU's busy and idle masks (create) or its busy mask and the starts of its idle instances of the
profile (reuse): so the best candidate of every GPU is one look-up in a table per (model, profile) over those
65,536 pairs. A table entry is already a key, with the tier of an empty GPU in it and every per-decision field
zero. A decision then adds the load where it leads, takes the best (tier, load, fit) class, and computes the
time fields and the ties for that class only: any GPU outside it ranks after the whole class whatever its time
fields.
"""

from __future__ import annotations

import bisect
import functools
import math
from typing import Annotated, Any

import msgspec
import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span
from shared.mig.tables import PAIRS, popcount_table, tables_for
from shared.policy.placement.decision import JobRequest
from shared.policy.snapshot import ClusterSnapshot

UNFIT = np.iinfo(np.int64).max
FIELDS = (("first", 4), ("load", 4), ("fit", 7), ("t1", 7), ("t2", 7), ("action", 1), ("cost", 10),
          ("destroyed", 4), ("node_empty", 7), ("fullest", 4), ("start", 4))
"""The packed key, most significant first, with each field's width in bits (59 in all)."""


class AlignParams(msgspec.Struct, frozen=True, kw_only=True):
    keep_empty: Annotated[float, msgspec.Meta(ge=0.0)] = 1.0
    """Share of usable GPUs kept empty: while more are empty, jobs go to the least loaded GPU (key 1); 1.0 =
    always pack. Spreading while empty GPUs are plenty cuts interference, and in the benchmark matrix the job
    rejection rate, but rejects more GPU-hours (docs/results.md)."""
    spread: bool = False
    """Once at the reserve, the least loaded of the busy GPUs that fit (less interference) before the fit."""
    fit_steps: Annotated[float, msgspec.Meta(ge=0.0)] = 20.0
    """FragCost increase is compared in steps of 1 / fit_steps."""
    in_time: bool = True
    """Align expected ends; False = space alone."""
    node_first: bool = False
    """Compare the node's extension before the GPU's."""
    top_k: Annotated[int, msgspec.Meta(ge=0)] = 3
    """Runners-up a decision lists (0 in the simulator, which reads only the choice)."""
    minute_s: Annotated[float, msgspec.Meta(gt=0.0)] = 60.0
    """One minute of the clock the hints and ends are in: the time buckets are minutes on a log-2 scale. A stack
    replaying a trace S times faster runs on wall time with every hint divided by S, and gives 60 / S."""
    gang_hours: Annotated[float, msgspec.Meta(ge=0.0)] = 4.0
    """A gang whose GPUs × duration hint exceed this many hours of every GPU of the cluster is *long*: it starts
    only with ``gang_room`` to spare, or after ``gang_wait_s`` (``shared.policy.placement.long_gangs``); 0 = off."""
    gang_room: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.5
    """Share of the cluster's GPUs a long gang must leave empty when it starts."""
    gang_wait_s: Annotated[float, msgspec.Meta(ge=0.0)] = 7200.0
    """A long gang that has waited this long is placed, and held for, as any gang."""


@functools.cache
def time_edges(minute_s: float = 60.0) -> npt.NDArray[np.float64]:
    """An extension is in bucket b when it reaches edge b - 1 and not edge b: more than nothing, one minute,
    three, seven, ...; infinity (a job that never ends, as far as anyone knows) is bucket 64."""
    edges = np.array((math.nextafter(0.0, 1.0), *(minute_s * (2.0**k - 1.0) for k in range(1, 63)), math.inf))
    edges.setflags(write=False)
    return edges


@functools.cache
def time_cuts(minute_s: float = 60.0) -> tuple[float, ...]:
    """``time_edges`` as a tuple of floats (``bisect`` over it costs less than a numpy call)."""
    return tuple(time_edges(minute_s).tolist())


def bucket(extension_s: float, minute_s: float = 60.0) -> int:
    """An extension on a log-2 scale of minutes: 0 for none, 1 up to a minute, 2 up to three, ...; 64 = never
    known to end."""
    return int(np.searchsorted(time_edges(minute_s), extension_s, side="right"))


def buckets(extension_s: npt.NDArray[np.float64], minute_s: float = 60.0) -> npt.NDArray[np.intp]:
    """``bucket`` of every element."""
    return np.searchsorted(time_edges(minute_s), extension_s, side="right")


def extension(ends: float, until: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """How far a job ending at ``ends`` runs past ``until`` (inf when the job's end is unknown and the GPU's
    is known; 0 when neither is)."""
    if math.isinf(ends):
        return np.where(np.isinf(until), 0.0, math.inf)
    return ends - until


SHIFT = {name: sum(w for _, w in FIELDS[k + 1:]) for k, (name, _) in enumerate(FIELDS)}
"""Each field's offset from the key's lowest bit."""
_WIDTH = dict(FIELDS)
LEAD = ((1 << (_WIDTH["first"] + _WIDTH["load"] + _WIDTH["fit"])) - 1) << SHIFT["fit"]
"""The leading fields (tier, load, fit). UNFIT & LEAD is LEAD, which no fitting GPU reaches (a tier is at most
the 7 compute slices of a GPU, not 15)."""
_T1, _T2, _NODE_EMPTY, _FULLEST = SHIFT["t1"], SHIFT["t2"], SHIFT["node_empty"], SHIFT["fullest"]


def _at(value: Any, name: str) -> Any:
    """``value`` clamped to field ``name``'s width, at its place in the key."""
    return np.minimum(value, (1 << _WIDTH[name]) - 1) << SHIFT[name]


def unpack(key: int) -> dict[str, int]:
    """The fields of a packed key, by name."""
    return {name: (key >> SHIFT[name]) & ((1 << width) - 1) for name, width in FIELDS}


class Context:
    """What every candidate of one decision shares: the clock, the job's expected end, whether empty GPUs are
    plenty, and the per-GPU columns the time fields read (each GPU's and its node's expected free time, the
    node's empty GPUs): a snapshot's (``of_snapshot``) or an index's. Per-GPU times are read for the candidates
    that need them only (``trailing``, ``node_end``): a decision compares them within its best (tier, load, fit)
    class, not over every GPU."""

    __slots__ = ("comfortable", "cuts", "edges", "ends", "gpu_ends", "node_empty", "node_ends", "now")

    def __init__(self, now: float, ends: float, comfortable: bool, gpu_ends: npt.NDArray[np.float64],
                 node_ends: npt.NDArray[np.float64], node_empty: npt.NDArray[np.int64],
                 minute_s: float = 60.0) -> None:
        self.now, self.ends, self.comfortable = now, ends, comfortable
        self.gpu_ends, self.node_ends, self.node_empty = gpu_ends, node_ends, node_empty
        self.edges = time_edges(minute_s)
        """The time buckets' edges (``time_edges`` of the clock's minute)."""
        self.cuts = time_cuts(minute_s)
        """The same edges as plain floats, for ``trailing_one``."""

    @classmethod
    def of_snapshot(cls, snap: ClusterSnapshot, job: JobRequest, params: AlignParams) -> Context:
        comfortable = params.keep_empty < 1.0 and (
            int(np.count_nonzero(snap.ok & (np.asarray(snap.busy) == 0)))
            > params.keep_empty * int(np.count_nonzero(snap.ok)))
        return cls.timed(job.now, job.duration_hint_s, params, comfortable, np.asarray(snap.ends),
                         np.asarray(snap.node_end), np.asarray(snap.node_empty))

    @classmethod
    def timed(cls, now: float | None, hint_s: float | None, params: AlignParams, comfortable: bool,
              gpu_ends: npt.NDArray[np.float64], node_ends: npt.NDArray[np.float64],
              node_empty: npt.NDArray[np.int64]) -> Context:
        """The job's expected end from its hint and the clock (inf without either, or without ``in_time``)."""
        ends = now + hint_s if params.in_time and hint_s is not None and now is not None else math.inf
        return cls(now if now is not None else 0.0, ends, comfortable, gpu_ends, node_ends, node_empty,
                   params.minute_s)

    def node_end(self, pos: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
        """When the node of each GPU at ``pos`` is expected to be free (now at the earliest)."""
        return np.maximum(self.node_ends[pos], self.now)


def _static(fitq: Any, action: int, after: Any, destroyed: Any, start: int, first: Any) -> Any:
    """The fields a candidate's GPU state alone decides, at their places in the key (the rest zero)."""
    return (_at(first, "first") | _at(fitq, "fit") | _at(action, "action")
            | _at(np.round(after * 1000).astype(np.int64), "cost") | _at(destroyed, "destroyed")
            | _at(15 - start, "start"))


@functools.cache
def table(model: GpuModel, profile: str, fit_steps: float, reuse: bool, by_busy: bool) -> npt.NDArray[np.int64]:
    """The key of a GPU's best candidate for ``profile`` with every per-decision field zero (UNFIT: none).
    Create: per ``busy << 8 | idle``, the best new instance. Reuse: per ``busy << 8 | starts``, ``starts`` a bit
    per start where an idle instance of the profile begins, the best of those. ``by_busy``: the tier is 1 for an
    empty GPU (empty GPUs are not plenty), else 0 (the decision adds the load)."""
    prof = model.profile(profile)
    pairs = np.arange(PAIRS, dtype=np.intp)
    busy, low = pairs >> 8, pairs & 0xFF
    frag = tables_for(model).fragcost
    before = frag[busy]
    first = (busy == 0).astype(np.int64) if by_busy else 0
    best = np.full(PAIRS, UNFIT, dtype=np.int64)
    for s in prof.placements:
        pm = span(prof.memory_slices, s)
        after = frag[busy | pm]
        fitq = np.round((after - before) * fit_steps).astype(np.int64) + 64
        if reuse:
            ok, key = ((low >> s) & 1) == 1, _static(fitq, 0, after, 0, s, first)
        else:
            ok = (busy & pm) == 0
            key = _static(fitq, 1, after, popcount_table()[low & pm].astype(np.int64), s, first)
        best = np.where(ok, np.minimum(best, key), best)
    best.setflags(write=False)
    return best


def static_of(gpu_busy: int, gpu_idle: int, model: GpuModel, prof: Profile, fit_steps: float, start: int,
              action: int, by_busy: bool) -> int:
    """``table``'s entry for one candidate (for a GPU whose best one is at its max count)."""
    frag = tables_for(model).fragcost
    pm = span(prof.memory_slices, start)
    after = float(frag[gpu_busy | pm])
    fitq = round((after - float(frag[gpu_busy])) * fit_steps) + 64
    destroyed = (gpu_idle & pm).bit_count() if action == 1 else 0
    return int(_static(fitq, action, np.float64(after), destroyed, start, int(by_busy and not gpu_busy)))


class Group(msgspec.Struct):
    """One GPU model's candidates: the usable positions, the profile asked for and one key per GPU. Unless
    ``exact``, only the GPUs of the best (tier, load, fit) class carry their full key; every other fitting GPU
    carries ``base`` alone (no time fields), which already ranks it after the whole class (``exact_keys`` fills
    them in)."""

    model: GpuModel
    prof: Profile
    pos: npt.NDArray[np.intp]
    keys: npt.NDArray[np.int64]
    exact: bool
    known: int
    """How many GPUs carry their full key: the best class's, or every one once ``exact``."""
    used: npt.NDArray[np.int64]
    base: npt.NDArray[np.int64]
    """Each GPU's key without the per-decision time and tie fields (UNFIT: no candidate)."""


@functools.cache
def every(n: int) -> npt.NDArray[np.intp]:
    out = np.arange(n, dtype=np.intp)
    out.setflags(write=False)
    return out


def group(snap: ClusterSnapshot, ctx: Context, params: AlignParams, k: int, model: GpuModel, prof: Profile,
          ) -> Group:
    """The key of every usable GPU of model ``k`` for ``prof``: the full key for the best class's GPUs, the key
    without its time and tie fields for the others (``Group``)."""
    ok = np.asarray(snap.ok)
    column = tables_for(model).index[prof.name]
    if len(snap.model_list) == 1 and ok.all():  # every GPU, in place: no gathers
        pos = every(len(ok))
        pair = np.asarray(snap.pair)  # model 0: busy << 8 | idle
        used = np.asarray(snap.used).astype(np.int64)
        reuse_bits = np.asarray(snap.idle_starts)[:, column]
    else:
        pos = np.flatnonzero(ok if len(snap.model_list) == 1 else (np.asarray(snap.model_idx) == k) & ok)
        pair = np.asarray(snap.pair)[pos] & 0xFFFF
        used = np.asarray(snap.used)[pos].astype(np.int64)
        reuse_bits = np.asarray(snap.idle_starts)[pos, column]
    by_busy = not ctx.comfortable
    base = np.minimum(table(model, prof.name, params.fit_steps, False, by_busy)[pair],
                      table(model, prof.name, params.fit_steps, True, by_busy)[(pair & 0xFF00) | reuse_bits])
    extra = _by_load(ctx, params, used)
    if extra is not None:
        base = np.where(base == UNFIT, UNFIT, base | extra)
    keys = base.copy()
    g = Group(model=model, prof=prof, pos=pos, keys=keys, exact=False, known=0, used=used, base=base)
    if keys.size:
        lead = keys & LEAD
        best = int(lead.min())
        if best != LEAD:
            sel = np.flatnonzero(lead == best)
            keys[sel] |= trailing(ctx, params, pos[sel], used[sel])
            g.known = len(sel)
    return g


def exact_keys(ctx: Context, params: AlignParams, g: Group) -> None:
    """Give every GPU of ``g`` its full key (a decision that looks past its best class)."""
    if not g.exact:
        g.keys = np.where(g.base == UNFIT, UNFIT, g.base | trailing(ctx, params, g.pos, g.used))
        g.exact, g.known = True, len(g.pos)


def widen(ctx: Context, params: AlignParams, g: Group, n: int) -> None:
    """Give full keys to at least the ``n`` best GPUs of ``g`` (runners-up): every GPU whose leading fields are
    at most the ``n``-th smallest. Any other GPU ranks after all of them whatever its time fields."""
    fit = np.flatnonzero(g.base != UNFIT)
    if g.exact or g.known >= min(n, fit.size):
        return
    lead = g.base[fit] & LEAD
    edge = np.partition(lead, n - 1)[n - 1] if fit.size > n else lead.max()
    rows = fit[lead <= edge]
    g.keys[rows] = g.base[rows] | trailing(ctx, params, g.pos[rows], g.used[rows])
    g.known = len(rows)


def full_key(ctx: Context, params: AlignParams, p: int, used: int, static: int) -> int:
    """One GPU's full key from its ``table`` entry (``static_of``): what a group holds once exact."""
    if static == UNFIT:
        return int(UNFIT)
    u = np.array([used], dtype=np.int64)
    extra = _by_load(ctx, params, u)
    at = np.array([p], dtype=np.intp)
    return int((static | (0 if extra is None else int(extra[0])) | trailing(ctx, params, at, u))[0])


def _by_load(ctx: Context, params: AlignParams, used: npt.NDArray[np.int64]) -> npt.NDArray[np.int64] | None:
    """The leading fields that depend on the GPU's load: the tier while empty GPUs are plenty (the least
    loaded GPU first), else the load field with ``spread``; None when neither applies."""
    if ctx.comfortable:
        return used << SHIFT["first"]
    if params.spread:
        return used << SHIFT["load"]
    return None


def trailing_one(ctx: Context, params: AlignParams, gpu_end: float, node_end: float, node_empty: int, used: int,
                 ) -> int:
    """``trailing`` for one GPU, from plain numbers (its and its node's expected free time, the node's empty
    GPUs, its busy compute slices): the same fields by the same arithmetic. A decision whose best class holds a
    handful of GPUs spends most of its time in numpy's per-call cost; this takes a few hundred nanoseconds."""
    now, ends, cuts = ctx.now, ctx.ends, ctx.cuts
    finite = not math.isinf(ends)
    until = gpu_end if gpu_end > now else now
    b1 = bisect.bisect_right(cuts, ends - until if finite else (0.0 if math.isinf(until) else math.inf))
    until = node_end if node_end > now else now
    b2 = bisect.bisect_right(cuts, ends - until if finite else (0.0 if math.isinf(until) else math.inf))
    t1, t2 = (b2, b1) if params.node_first else (b1, b2)
    return ((t1 << _T1) | (t2 << _T2) | ((node_empty if node_empty < 127 else 127) << _NODE_EMPTY)
            | ((15 - used) << _FULLEST))


def trailing(ctx: Context, params: AlignParams, pos: npt.NDArray[np.intp], used: npt.NDArray[np.int64],
             ) -> npt.NDArray[np.int64]:
    """The key's per-decision fields after the fit: the extensions in time, then the node's empty GPUs and the
    GPU's load (the other fields are the table's). Both extensions in one pass: a decision's best class is often
    a handful of GPUs, where numpy's per-call cost is what counts."""
    k = len(pos)
    until = np.maximum(np.concatenate((ctx.gpu_ends[pos], ctx.node_ends[pos])), ctx.now)
    b = ctx.edges.searchsorted(extension(ctx.ends, until), side="right")
    t1, t2 = (b[k:], b[:k]) if params.node_first else (b[:k], b[k:])
    return ((t1 << SHIFT["t1"]) | (t2 << SHIFT["t2"]) | (np.minimum(ctx.node_empty[pos], 127) << SHIFT["node_empty"])
            | ((15 - used) << SHIFT["fullest"]))
