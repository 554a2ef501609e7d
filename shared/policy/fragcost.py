"""FragCost of one GPU and the cluster's fragmentation rate, both as table look-ups.

``FragCost`` (docs/architecture.md) ranks placements on one GPU; it reads only busy instances because idle ones are
reclaimable. The **fragmentation rate** is the cluster KPI: the share of free memory slices that the demand
mix cannot use. Per GPU, the expected unusable free slices under the mix are precomputed for all 256 masks,
stacked for the snapshot's models, so the rate over a snapshot is one gather and one sum. The FGD baseline's
per-placement table (least increase of those slices) lives here too.

Demand weights are keyed by profile *shape* (``1g``, ``2g``, ``3g``, ``4g``, ``7g``, ``1g.2x``, ...) so one
mix applies to every GPU model; on each model a shape's weight goes to the profile of that shape.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

from shared.errors import RequestError
from shared.mig.geometry import GpuModel
from shared.mig.occupancy import span
from shared.mig.tables import PAIRS, popcount_table, tables_for
from shared.policy.snapshot import ClusterSnapshot

_SHAPE = re.compile(r"^(\d)g(\+me|\.2x)?$")
_PREFIX = "nvidia.com/mig-"

UNIFORM_SHAPES: dict[str, float] = {"1g": 1.0, "1g.2x": 1.0, "2g": 1.0, "3g": 1.0, "4g": 1.0, "7g": 1.0}
"""An uninformed mix: every non-``+me`` shape equally often (A30's 4g is its full GPU)."""


def frag_cost(model: GpuModel, mask: int) -> float:
    """FragCost of ``model`` with the memory slices of ``mask`` in use (0 = empty, 1 = nothing fits)."""
    if not 0 <= mask <= model.full_mask:
        raise ValueError(f"mask {mask:#x} is outside {model.name}'s {model.memory_slices} memory slices")
    return tables_for(model).cost(mask)


def frag_cost_gpu(snap: ClusterSnapshot, gpu_id: str) -> float:
    """FragCost of one GPU of the snapshot, counting busy instances only (idle ones are reclaimable)."""
    gpu = snap.gpu(gpu_id)
    return tables_for(snap.geometry.model(gpu.model)).cost(gpu.busy_mask)


def shape_of(name: str) -> str:
    """``3g.20gb`` -> ``3g``; a shape is returned as is. Used to key demand by shape from profile names."""
    name = name.strip()
    if name.startswith(_PREFIX):
        name = name[len(_PREFIX):]
    if _SHAPE.match(name):
        return name
    head, _, tail = name.partition(".")
    if not _SHAPE.match(head):
        raise RequestError(f"{name!r} is neither a MIG shape (1g, 3g, 1g.2x, ...) nor a profile name")
    return head + ("+me" if tail.endswith("+me") else "")


def demand_weights(shapes: Iterable[str]) -> dict[str, float]:
    """Request shares by shape from a sequence of requested shapes (or profile names), summing to 1.

    Note that a double-memory 1g profile name (``1g.10gb`` on A100-40GB) cannot be told from a plain 1g one
    without its model; pass its shape ``1g.2x`` to count it as such.
    """
    counts = Counter(shape_of(s) for s in shapes)
    total = sum(counts.values())
    if total == 0:
        return {}
    return {shape: n / total for shape, n in sorted(counts.items())}


def weights_key(weights: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """Weights as a hashable, canonical mix: keys normalised to shapes (``3g.20gb`` counts as ``3g``)."""
    merged: dict[str, float] = {}
    for k, v in weights.items():
        if v < 0:
            raise RequestError(f"demand weight of {k!r} is negative")
        if v > 0:
            shape = shape_of(k)
            merged[shape] = merged.get(shape, 0.0) + float(v)
    return tuple(sorted(merged.items()))


@functools.lru_cache(maxsize=256)
def _frag_table(model: GpuModel, key: tuple[tuple[str, float], ...]) -> npt.NDArray[np.float64]:
    """Expected unusable free slices per busy mask, for the shape weights ``key`` on ``model``.

    A shape the model lacks can use none of its slices, so its share counts every free slice as unusable.
    """
    tables = tables_for(model)
    by_shape = {p.shape: tables.index[p.name] for p in model.profiles}
    total = sum(w for _, w in key)
    free = tables.free_slices.astype(np.float64)
    out = np.zeros_like(free)
    for shape, w in key:
        i = by_shape.get(shape)
        out += (w / total) * (free if i is None else free - tables.pack_slices[:, i])
    out.setflags(write=False)
    return out


def frag_slices_table(model: GpuModel, weights: Mapping[str, float]) -> npt.NDArray[np.float64]:
    """Per busy mask (0..255): free slices the mix cannot use on ``model`` (cached per model and mix)."""
    return _frag_table(model, weights_key(weights))


@functools.lru_cache(maxsize=256)
def _stacked(models: tuple[GpuModel, ...], key: tuple[tuple[str, float], ...]) -> npt.NDArray[np.float64]:
    """Per ``model index << 8 | busy mask``: (unusable, free) slices, for every model of a snapshot."""
    out = np.zeros((len(models) * 256, 2), dtype=np.float64)
    for k, m in enumerate(models):
        out[k * 256:(k + 1) * 256, 0] = _frag_table(m, key)
        out[k * 256:(k + 1) * 256, 1] = tables_for(m).free_slices
    out.setflags(write=False)
    return out


def frag_rate(snap: ClusterSnapshot, weights: Mapping[str, float]) -> float:
    """Share of the cluster's free memory slices that the demand mix cannot use, in [0, 1].

    Over healthy GPUs in MIG mode; idle instances count as free (reclaimable). 0 when nothing is free. Empty
    ``weights`` mean ``UNIFORM_SHAPES``. A shape a model lacks counts all its free slices as unusable.
    """
    if len(snap) == 0:
        return 0.0
    ok = np.asarray(snap.mig, dtype=bool) & np.asarray(snap.healthy, dtype=bool)
    return frag_rate_columns(snap.model_list, snap.model_idx, snap.busy, ok, weights)


def frag_rate_columns(
    model_list: tuple[GpuModel, ...], model_idx: npt.NDArray[np.generic], busy: npt.NDArray[np.generic],
    ok: npt.NDArray[np.bool_], weights: Mapping[str, float],
) -> float:
    """``frag_rate`` from the columns it reads (model index per GPU into ``model_list``, busy mask, usable),
    for a caller that keeps them itself (the simulator samples it without building a snapshot)."""
    unusable, free = _per_gpu(model_list, model_idx, busy, weights)[ok].sum(axis=0)
    return rate_of(float(unusable), float(free))


def rate_of(unusable: float, free: float) -> float:
    """The fragmentation rate of GPUs with these unusable and free memory slices in all (0 when none is free)."""
    return 0.0 if free <= 0 else min(1.0, max(0.0, unusable / free))


def _per_gpu(model_list: tuple[GpuModel, ...], model_idx: npt.NDArray[np.generic],
             busy: npt.NDArray[np.generic], weights: Mapping[str, float]) -> npt.NDArray[np.float64]:
    """Per GPU: (unusable free slices under the mix, free slices), one gather."""
    table = _stacked(model_list, weights_key(weights) or weights_key(UNIFORM_SHAPES))
    return table[(np.asarray(model_idx, dtype=np.intp) << 8) | np.asarray(busy)]


def frag_by_gpu(snap: ClusterSnapshot, weights: Mapping[str, float]) -> tuple[
    npt.NDArray[np.float64], npt.NDArray[np.float64]
]:
    """Per GPU of ``snap``: the free memory slices the demand mix cannot use, and the free memory slices (both
    0 on a GPU that is unhealthy or not in MIG mode); summed over any set of GPUs, ``rate_of`` gives its rate."""
    ok = np.asarray(snap.mig, dtype=bool) & np.asarray(snap.healthy, dtype=bool)
    out = np.where(ok[:, None], _per_gpu(snap.model_list, snap.model_idx, snap.busy, weights), 0.0)
    return out[:, 0].astype(np.float64), out[:, 1].astype(np.float64)


FGD_SCALE = 1_000_000
"""FGD scores are compared as integers: the change of unusable slices times this."""
FGD_OFFSET = 8 * FGD_SCALE + 1
"""Added to a quantised change (in [-8, 8] slices) so it packs as a non-negative key field."""


@functools.lru_cache(maxsize=64)  # ~1 MiB each: keep the mix fixed for a run
def fgd_create_table(model: GpuModel, profile: str, key: tuple[tuple[str, float], ...]) -> tuple[
    npt.NDArray[np.int8], npt.NDArray[np.int64], npt.NDArray[np.int64]
]:
    """Per ``busy << 8 | idle``: the start with the least increase of expected unusable free slices, then
    the fewest idle slices destroyed, then the highest start; the quantised increase; the idle slices
    destroyed."""
    prof = model.profile(profile)
    frag = _frag_table(model, key)
    pairs = np.arange(PAIRS, dtype=np.int64)
    busy, idle = pairs >> 8, pairs & 0xFF
    pop = popcount_table()
    best_s = np.full(PAIRS, -1, dtype=np.int8)
    best_d = np.full(PAIRS, np.iinfo(np.int64).max, dtype=np.int64)
    best_o = np.full(PAIRS, 255, dtype=np.int64)
    for s in sorted(prof.placements, reverse=True):
        pm = span(prof.memory_slices, s)
        ok = (busy & pm) == 0
        d = np.rint((frag[(busy | pm) & 0xFF] - frag[busy]) * FGD_SCALE).astype(np.int64)
        o = pop[idle & pm].astype(np.int64)
        better = ok & ((d < best_d) | ((d == best_d) & (o < best_o)))
        best_s[better] = s
        best_d[better] = d[better]
        best_o[better] = o[better]
    for arr in (best_s, best_d, best_o):
        arr.setflags(write=False)
    return best_s, best_d, best_o
