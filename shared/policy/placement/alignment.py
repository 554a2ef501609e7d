"""The keys of the ``migsched`` placement rule (``shared.policy.placement.plugins.migsched``): one int64 per
GPU, lower is better, so a decision over thousands of GPUs is a few gathers and one argmin.

A key packs, most significant first (``FIELDS``): the tier (empty GPU opened, or the GPU's load while empty GPUs
are plenty), the load again with ``spread``, the FragCost increase in steps of ``1 / fit_steps``, the job's
extension of the GPU's and of the node's expected busy time (``bucket``), reuse before create, FragCost after,
idle slices destroyed, the node's empty GPUs, the fullest GPU, the highest start. Within one GPU only the
*static* fields differ between its candidate starts (increase, action, cost, destroyed, start), and they depend
only on the GPU's busy and idle masks (create) or its busy mask and the starts of its idle instances of the
profile (reuse): so the best candidate of every GPU is one look-up in a table per (model, profile) over those
65,536 pairs, and only the per-GPU fields are computed per decision.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from typing import Any

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
_STATIC = (("fit", 7), ("action", 1), ("cost", 10), ("destroyed", 4), ("start", 4))
"""A table entry: the static fields of a GPU's best candidate (26 bits)."""


class AlignParams(msgspec.Struct, frozen=True, kw_only=True):
    keep_empty: float = 1.0
    """Share of usable GPUs kept empty: while more are empty, jobs go to the least loaded GPU (key 1); 1.0 =
    always pack. Spreading while empty GPUs are plenty cuts interference, and in the benchmark matrix the job
    rejection rate, but rejects more GPU-hours (docs/results.md)."""
    spread: bool = False
    """Once at the reserve, the least loaded of the busy GPUs that fit (less interference) before the fit."""
    fit_steps: float = 20.0
    """FragCost increase is compared in steps of 1 / fit_steps."""
    in_time: bool = True
    """Align expected ends; False = space alone."""
    node_first: bool = False
    """Compare the node's extension before the GPU's."""
    top_k: int = 3
    """Runners-up a decision lists (0 in the simulator, which reads only the choice)."""


_EDGES = (math.nextafter(0.0, 1.0), *(60.0 * (2.0**k - 1.0) for k in range(1, 63)), math.inf)
"""An extension is in bucket b when it reaches _EDGES[b - 1] and not _EDGES[b]: more than nothing, one minute,
three, seven, ...; infinity (a job that never ends, as far as anyone knows) is bucket 64."""
_EDGES_A = np.array(_EDGES)


def bucket(extension_s: float) -> int:
    """An extension on a log-2 scale of minutes: 0 for none, 1 up to a minute, 2 up to three, ...; 64 = never
    known to end."""
    return bisect.bisect_right(_EDGES, extension_s)


def buckets(extension_s: npt.NDArray[np.float64]) -> npt.NDArray[np.intp]:
    """``bucket`` of every element."""
    return np.searchsorted(_EDGES_A, extension_s, side="right")


def extension(ends: float, until: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """How far a job ending at ``ends`` runs past ``until`` (inf when the job's end is unknown and the GPU's
    is known; 0 when neither is)."""
    if math.isinf(ends):
        return np.where(np.isinf(until), 0.0, math.inf)
    return ends - until


def _pack(fields: Sequence[Any], layout: Sequence[tuple[str, int]]) -> Any:
    key: Any = 0
    for value, (_, width) in zip(fields, layout, strict=True):
        key = (key << width) + np.minimum(value, (1 << width) - 1)
    return key


_SHIFT = {name: sum(w for _, w in FIELDS[k + 1:]) for k, (name, _) in enumerate(FIELDS)}
"""Each field's offset from the key's lowest bit."""


def unpack(key: int) -> dict[str, int]:
    """The fields of a packed key, by name."""
    return {name: (key >> _SHIFT[name]) & ((1 << width) - 1) for name, width in FIELDS}


class Context:
    """What every candidate of one decision shares: the snapshot, the clock, the job's expected end, and whether
    empty GPUs are plenty. Per-GPU times are read for the candidates that need them only (``gpu_end``,
    ``node_end``): a decision compares them within its best (tier, fit) class, not over every GPU."""

    def __init__(self, snap: ClusterSnapshot, job: JobRequest, params: AlignParams) -> None:
        self.snap = snap
        self.now = job.now if job.now is not None else 0.0
        timed = params.in_time and job.duration_hint_s is not None and job.now is not None
        self.ends = self.now + job.duration_hint_s if timed and job.duration_hint_s is not None else math.inf
        self.comfortable = params.keep_empty < 1.0 and (
            int(np.count_nonzero(snap.ok & (np.asarray(snap.busy) == 0)))
            > params.keep_empty * int(np.count_nonzero(snap.ok)))

    def gpu_end(self, pos: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
        """When each GPU at ``pos`` is expected to be free (now at the earliest)."""
        return np.maximum(self.snap.ends[pos], self.now)

    def node_end(self, pos: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
        """When the node of each GPU at ``pos`` is expected to be free (now at the earliest)."""
        return np.maximum(self.snap.node_end[pos], self.now)


def _static(fitq: Any, action: int, after: Any, destroyed: Any, start: int) -> Any:
    return _pack((fitq, action, np.round(after * 1000).astype(np.int64), destroyed, 15 - start), _STATIC)


@functools.cache
def table(model: GpuModel, profile: str, fit_steps: float, reuse: bool) -> npt.NDArray[np.int64]:
    """The static fields of a GPU's best candidate for ``profile`` (UNFIT: none). Create: per ``busy << 8 |
    idle``, the best new instance. Reuse: per ``busy << 8 | starts``, ``starts`` a bit per start where an idle
    instance of the profile begins, the best of those."""
    prof = model.profile(profile)
    pairs = np.arange(PAIRS, dtype=np.intp)
    busy, low = pairs >> 8, pairs & 0xFF
    frag = tables_for(model).fragcost
    before = frag[busy]
    best = np.full(PAIRS, UNFIT, dtype=np.int64)
    for s in prof.placements:
        pm = span(prof.memory_slices, s)
        after = frag[busy | pm]
        fitq = np.round((after - before) * fit_steps).astype(np.int64) + 64
        if reuse:
            ok, key = ((low >> s) & 1) == 1, _static(fitq, 0, after, 0, s)
        else:
            ok, key = (busy & pm) == 0, _static(fitq, 1, after, popcount_table()[low & pm].astype(np.int64), s)
        best = np.where(ok, np.minimum(best, key), best)
    best.setflags(write=False)
    return best


def static_of(gpu_busy: int, gpu_idle: int, model: GpuModel, prof: Profile, fit_steps: float, start: int,
              action: int) -> int:
    """The static fields of one candidate (for a GPU whose best one is at its max count)."""
    frag = tables_for(model).fragcost
    pm = span(prof.memory_slices, start)
    after = float(frag[gpu_busy | pm])
    fitq = round((after - float(frag[gpu_busy])) * fit_steps) + 64
    destroyed = (gpu_idle & pm).bit_count() if action == 1 else 0
    return int(_static(fitq, action, np.float64(after), destroyed, start))


class Group(msgspec.Struct):
    """One GPU model's candidates: the usable positions, the profile asked for and one key per GPU. Unless
    ``exact``, only the GPUs of the best (tier, load, fit) class carry their full key; every other fitting GPU
    carries those leading fields alone, which already rank it after the whole class (``exact_keys`` fills
    them in)."""

    model: GpuModel
    prof: Profile
    pos: npt.NDArray[np.intp]
    keys: npt.NDArray[np.int64]
    exact: bool
    known: int
    """How many GPUs carry their full key: the best class's, or every one once ``exact``."""
    busy: npt.NDArray[np.intp]
    used: npt.NDArray[np.int64]
    static: npt.NDArray[np.int64]


def group(snap: ClusterSnapshot, ctx: Context, params: AlignParams, k: int, model: GpuModel, prof: Profile,
          ) -> Group:
    """The key of every usable GPU of model ``k`` for ``prof``: the full key for the best class's GPUs, the
    leading fields for the others (``Group``)."""
    ok = snap.ok
    pos = np.flatnonzero(ok if len(snap.model_list) == 1 else (np.asarray(snap.model_idx) == k) & ok)
    pair = np.asarray(snap.pair)[pos] & 0xFFFF  # busy << 8 | idle
    busy = pair >> 8
    used = np.asarray(snap.used)[pos].astype(np.int64)
    reuse_bits = np.asarray(snap.idle_starts)[pos, tables_for(model).index[prof.name]]
    static = np.minimum(table(model, prof.name, params.fit_steps, False)[pair],
                        table(model, prof.name, params.fit_steps, True)[(pair & 0xFF00) | reuse_bits])
    high = _leading(ctx, params, busy, used, static)
    g = Group(model=model, prof=prof, pos=pos, keys=high, exact=False, known=0, busy=busy, used=used,
              static=static)
    if high.size:
        best = int(high.min())
        if best != UNFIT:
            sel = np.flatnonzero(high == best)
            high[sel] = best | _trailing(ctx, params, pos[sel], used[sel], static[sel])
            g.known = len(sel)
    return g


def exact_keys(ctx: Context, params: AlignParams, g: Group) -> None:
    """Give every GPU of ``g`` its full key (a decision that looks past its best class)."""
    if not g.exact:
        g.keys = np.where(g.static == UNFIT, UNFIT,
                          _leading(ctx, params, g.busy, g.used, g.static)
                          | _trailing(ctx, params, g.pos, g.used, g.static))
        g.exact, g.known = True, len(g.pos)


def assemble(ctx: Context, params: AlignParams, pos: npt.NDArray[np.intp], busy: npt.NDArray[np.intp],
             used: npt.NDArray[np.int64], static: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Full keys from each GPU's static fields and its per-decision ones (UNFIT stays UNFIT)."""
    return np.where(static == UNFIT, UNFIT,
                    _leading(ctx, params, busy, used, static) | _trailing(ctx, params, pos, used, static))


def _leading(ctx: Context, params: AlignParams, busy: npt.NDArray[np.intp], used: npt.NDArray[np.int64],
             static: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The key's leading fields (tier, load, fit), the rest zero; UNFIT where the GPU has no candidate."""
    first: npt.NDArray[np.int64] | int
    load: npt.NDArray[np.int64] | int
    if ctx.comfortable:
        first, load = used, 0
    else:
        first, load = (busy == 0).astype(np.int64), used if params.spread else 0
    high = (first << _SHIFT["first"]) | (load << _SHIFT["load"]) | ((static >> 19) << _SHIFT["fit"])
    return np.where(static == UNFIT, UNFIT, high)


def _trailing(ctx: Context, params: AlignParams, pos: npt.NDArray[np.intp], used: npt.NDArray[np.int64],
              static: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The key's other fields: the extensions in time, then the static ones and the ties (fit GPUs only: the
    fields are within their widths by construction, but the node's count)."""
    g_ext = buckets(extension(ctx.ends, ctx.gpu_end(pos)))
    n_ext = buckets(extension(ctx.ends, ctx.node_end(pos)))
    t1, t2 = (n_ext, g_ext) if params.node_first else (g_ext, n_ext)
    mid = (static >> 4) & ((1 << 15) - 1)  # action, cost, destroyed
    start = static & 15
    node_empty = np.minimum(np.asarray(ctx.snap.node_empty)[pos], 127)
    return ((t1 << _SHIFT["t1"]) | (t2 << _SHIFT["t2"]) | (mid << _SHIFT["destroyed"])
            | (node_empty << _SHIFT["node_empty"]) | ((15 - used) << _SHIFT["fullest"]) | start)
