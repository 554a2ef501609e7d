"""The balancer's packed keys, precomputed: per GPU model and request, look-up tables of every key but tier and
load, indexed by ``busy << 8 | idle`` (create) or ``busy << 8 | starts of idle instances`` (reuse), and the
tier-and-load part per used compute slices. ``balancer.place_mig`` gathers from them over the snapshot's
columns; the placement index and the live placement keep them per GPU. The key layout is
``balancer.pack_key``'s.
"""

from __future__ import annotations

import functools

import msgspec
import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span
from shared.mig.tables import PAIRS, ModelTables, tables_for
from shared.policy.request import Demand, resolve_profile

__all__ = ["_UNFIT", "_Compiled", "_acceptable", "_compile", "_compile_profiles", "_create_part", "_tier_load"]


def _acceptable(tables: ModelTables, wanted: Profile, allow_larger: bool) -> dict[str, Profile]:
    """The profiles a request for ``wanted`` may take: itself, or with ``allow_larger`` any that covers it."""
    if not allow_larger:
        return {wanted.name: wanted}
    return {
        p.name: p
        for p in tables.profiles
        if p.compute_slices >= wanted.compute_slices
        and p.memory_slices >= wanted.memory_slices
        and p.media_extensions == wanted.media_extensions
    }


_UNFIT = 1 << 62
"""Key of a GPU with no candidate: above every real key (< 2**56) even after adding tier and load."""


class _Compiled(msgspec.Struct, frozen=True):
    """The per-request look-up tables of every model in a snapshot, stacked as ``model << 16 | index``."""

    profiles: tuple[Profile | None, ...]
    create: npt.NDArray[np.int64] | None
    """Per ``model << 16 | busy << 8 | idle``: the create key minus tier and load, or _UNFIT."""
    reuse: tuple[tuple[npt.NDArray[np.int64], npt.NDArray[np.intp]], ...]
    """Per acceptable profile slot: (key part per ``model << 16 | busy << 8 | idle starts``, profile index of
    that slot on each model)."""
    idle_bits: npt.NDArray[np.uint32]
    """Per model: the ``idle_profiles`` bits of the acceptable profiles (screens GPUs before any look-up)."""


def _before_q(model: GpuModel, delta: bool) -> npt.NDArray[np.int64] | int:
    """Per ``busy << 8 | x``: the quantised FragCost before, subtracted from the key in ``delta`` mode."""
    if not delta:
        return 0
    return tables_for(model).fragcost_q[np.arange(PAIRS, dtype=np.int64) >> 8]


@functools.lru_cache(maxsize=4096)
def _create_part(model: GpuModel, profile: str, delta: bool = False) -> npt.NDArray[np.int64]:
    start, cost, ov = tables_for(model).best_create(profile)
    cost = cost - _before_q(model, delta)
    part = (1 << 53) + (cost << 22) + (ov.astype(np.int64) << 15) + (15 - start.astype(np.int64))
    out = np.where(start >= 0, part, _UNFIT)
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=256)
def _reuse_part(model: GpuModel, profile: str, waste: int, delta: bool = False) -> npt.NDArray[np.int64]:
    """Per ``busy << 8 | starts`` (a bit per start of an idle ``profile`` instance): the best reuse key
    part."""
    size = model.profile(profile).memory_slices
    cost_q = tables_for(model).fragcost_q
    pairs = np.arange(PAIRS, dtype=np.int64)
    busy, starts = pairs >> 8, pairs & 0xFF
    best = np.full(PAIRS, _UNFIT, dtype=np.int64)
    for s in range(model.memory_slices - size + 1):
        val = ((cost_q[(busy | span(size, s)) & 0xFF] - (cost_q[busy] if delta else 0)) << 22) \
            + (waste << 19) + (15 - s)
        best = np.where(((starts >> s) & 1).astype(bool) & (val < best), val, best)
    best.setflags(write=False)
    return best


def _compile(
    models: tuple[GpuModel, ...], demand: Demand, dynamic: bool, allow_larger: bool, delta: bool = False
) -> _Compiled:
    # keyed on the resolved profiles, not the demand: sized requests vary endlessly, resolutions do not
    return _compile_profiles(
        models, tuple(resolve_profile(demand, m) for m in models), dynamic, allow_larger, delta
    )


@functools.lru_cache(maxsize=128)
def _compile_profiles(
    models: tuple[GpuModel, ...], profiles: tuple[Profile | None, ...], dynamic: bool, allow_larger: bool,
    delta: bool = False,
) -> _Compiled:
    unfit = np.full(PAIRS, _UNFIT, dtype=np.int64)
    create = None
    if dynamic:
        create = np.concatenate([unfit if p is None else _create_part(m, p.name, delta)
                                 for m, p in zip(models, profiles, strict=True)])
    per_model: list[list[tuple[npt.NDArray[np.int64], int]]] = []
    idle_bits = np.zeros(len(models), dtype=np.uint32)
    for k, (m, p) in enumerate(zip(models, profiles, strict=True)):
        slots: list[tuple[npt.NDArray[np.int64], int]] = []
        if p is not None:
            index = tables_for(m).index
            for name, acc in _acceptable(tables_for(m), p, allow_larger).items():
                slots.append((_reuse_part(m, name, acc.memory_slices - p.memory_slices, delta), index[name]))
                idle_bits[k] |= np.uint32(1 << index[name])
        per_model.append(slots)
    reuse = []
    for a in range(max((len(s) for s in per_model), default=0)):
        table = np.concatenate([s[a][0] if a < len(s) else unfit for s in per_model])
        pidx = np.array([s[a][1] if a < len(s) else 0 for s in per_model], dtype=np.intp)
        reuse.append((table, pidx))
    for arr in ([create] if create is not None else []) + [t for t, _ in reuse]:
        arr.setflags(write=False)
    idle_bits.setflags(write=False)
    return _Compiled(profiles=profiles, create=create, reuse=tuple(reuse), idle_bits=idle_bits)


@functools.lru_cache(maxsize=1024)
def _tier_load(models: tuple[GpuModel, ...], threshold: float, lazy_first: bool) -> npt.NDArray[np.int64]:
    """Per ``model << 4 | used compute slices``: tier << 54 | load_q << 4, load_q = load in thousandths."""
    t_q = round(threshold * 1000)
    out = np.zeros(len(models) * 16, dtype=np.int64)
    for k, m in enumerate(models):
        used = np.arange(16)
        load_q = np.rint(used * 1000.0 / max(m.compute_slices, 1)).astype(np.int64)
        tier = (load_q >= t_q).astype(np.int64) if lazy_first else np.zeros(16, dtype=np.int64)
        out[k * 16:(k + 1) * 16] = (tier << 54) + (load_q << 4)
    out.setflags(write=False)
    return out
