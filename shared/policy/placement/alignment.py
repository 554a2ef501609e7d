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
    """What every candidate of one decision shares: the clock, the job's expected end, and per GPU its
    expected free time, its node's, and its node's empty GPUs."""

    def __init__(self, snap: ClusterSnapshot, job: JobRequest, params: AlignParams) -> None:
        self.now = job.now if job.now is not None else 0.0
        timed = params.in_time and job.duration_hint_s is not None and job.now is not None
        self.ends = self.now + job.duration_hint_s if timed and job.duration_hint_s is not None else math.inf
        node = snap.node_idx
        nodes = int(node.max()) + 1 if len(node) else 0
        self.gpu_end = np.maximum(snap.ends, self.now)
        node_end = np.full(nodes, self.now)
        np.maximum.at(node_end, node, self.gpu_end)
        self.node_end = node_end[node]
        self.empty = snap.ok & (np.asarray(snap.busy) == 0)
        self.node_empty = np.bincount(node, weights=self.empty, minlength=nodes).astype(np.int64)[node]
        self.comfortable = int(self.empty.sum()) > params.keep_empty * int(snap.ok.sum())


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
    """One GPU model's candidates: the usable positions, the profile asked for and one key per GPU."""

    model: GpuModel
    prof: Profile
    pos: npt.NDArray[np.intp]
    keys: npt.NDArray[np.int64]


def group(snap: ClusterSnapshot, ctx: Context, params: AlignParams, k: int, model: GpuModel, prof: Profile,
          ) -> Group:
    """The key of every usable GPU of model ``k`` for ``prof``."""
    ok = snap.ok
    pos = np.flatnonzero(ok if len(snap.model_list) == 1 else (np.asarray(snap.model_idx) == k) & ok)
    pair = np.asarray(snap.pair)[pos] & 0xFFFF  # busy << 8 | idle
    busy = pair >> 8
    used = np.asarray(snap.used)[pos].astype(np.int64)
    reuse_bits = np.asarray(snap.idle_starts)[pos, tables_for(model).index[prof.name]]
    static = np.minimum(table(model, prof.name, params.fit_steps, False)[pair],
                        table(model, prof.name, params.fit_steps, True)[(pair & 0xFF00) | reuse_bits])
    return Group(model=model, prof=prof, pos=pos, keys=assemble(ctx, params, pos, busy, used, static))


def assemble(ctx: Context, params: AlignParams, pos: npt.NDArray[np.intp], busy: npt.NDArray[np.intp],
             used: npt.NDArray[np.int64], static: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Full keys from each GPU's static fields and its per-decision ones (UNFIT stays UNFIT)."""
    g_ext = buckets(extension(ctx.ends, ctx.gpu_end[pos]))
    n_ext = buckets(extension(ctx.ends, ctx.node_end[pos]))
    t1, t2 = (n_ext, g_ext) if params.node_first else (g_ext, n_ext)
    first: npt.NDArray[np.int64] | int
    load: npt.NDArray[np.int64] | int
    if ctx.comfortable:
        first, load = used, 0
    else:
        first, load = (busy == 0).astype(np.int64), used if params.spread else 0
    fit = static >> 19
    mid = (static >> 4) & ((1 << 15) - 1)  # action, cost, destroyed
    start = static & 15
    # the fields at their offsets (``_SHIFT``); each is within its width by construction but the node's count
    key = ((first << _SHIFT["first"]) | (load << _SHIFT["load"]) | (fit << _SHIFT["fit"])
           | (t1 << _SHIFT["t1"]) | (t2 << _SHIFT["t2"]) | (mid << _SHIFT["destroyed"])
           | (np.minimum(ctx.node_empty[pos], 127) << _SHIFT["node_empty"]) | ((15 - used) << _SHIFT["fullest"])
           | start)
    return np.where(static == UNFIT, UNFIT, key)
