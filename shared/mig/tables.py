"""Per-model look-up tables, precomputed once, so that scoring a GPU or a candidate is an array index.

Index conventions: a mask is an int in [0, 256); a (busy, idle) pair is ``busy << 8 | idle``.
"""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span

MASKS = 256
PAIRS = MASKS * MASKS
COST_SCALE = 1_000_000_000
"""FragCost is compared after rounding to 1e-9 so that equal rationals tie exactly."""

_POP = np.array([bin(i).count("1") for i in range(MASKS)], dtype=np.uint8)


def popcount_table() -> npt.NDArray[np.uint8]:
    return _POP


class ModelTables:
    """FragCost, per-profile feasibility and packing, and best-placement tables for one GPU model."""

    def __init__(self, model: GpuModel, include_me: bool = False) -> None:
        self.model = model
        self.profiles: tuple[Profile, ...] = model.profiles
        self.index = {p.name: i for i, p in enumerate(self.profiles)}
        scoring = model.scoring_profiles(include_me)
        self.scoring_idx = np.array([self.index[p.name] for p in scoring], dtype=np.intp)
        masks = np.arange(MASKS, dtype=np.int64)
        nprof = len(self.profiles)
        feasible = np.zeros((MASKS, nprof), dtype=np.int16)
        pack = np.zeros((MASKS, nprof), dtype=np.int16)
        for i, p in enumerate(self.profiles):
            for s in p.placements:
                feasible[:, i] += (masks & span(p.memory_slices, s)) == 0
            pack[:, i] = [self._max_pack_slices(p, int(m)) for m in masks]
        self.feasible = feasible
        self.pack_slices = pack
        empty = feasible[0, self.scoring_idx].astype(np.float64)
        ratio = feasible[:, self.scoring_idx] / empty
        cost = 1.0 - ratio.mean(axis=1)
        # masks beyond the GPU's slices are not states; mark them as full
        beyond = (masks & ~model.full_mask) != 0
        cost[beyond] = 1.0
        self.fragcost = cost
        self.fragcost_q = np.rint(cost * COST_SCALE).astype(np.int64)
        self.free_slices = model.memory_slices - _POP.astype(np.int16)
        self._best: dict[int, tuple[npt.NDArray[np.int8], npt.NDArray[np.int64], npt.NDArray[np.uint8]]] = {}

    def _max_pack_slices(self, p: Profile, mask: int) -> int:
        # same-size intervals: taking the earliest-ending free one first is optimal
        used, n = mask, 0
        for s in sorted(p.placements):
            if n >= p.max_count:
                break
            pm = span(p.memory_slices, s)
            if not used & pm:
                used |= pm
                n += 1
        return n * p.memory_slices

    def cost(self, mask: int) -> float:
        return float(self.fragcost[mask])

    def best_create(self, profile: str) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
        """For each ``busy << 8 | idle``: the best start (-1 if none), its quantised FragCost after, and the
        idle slices it overlaps. Best = lowest FragCost, then fewest idle slices destroyed, then highest start."""
        i = self.index[profile]
        cached = self._best.get(i)
        if cached is not None:
            return cached
        p = self.profiles[i]
        pairs = np.arange(PAIRS, dtype=np.int64)
        busy, idle = pairs >> 8, pairs & 0xFF
        best_start = np.full(PAIRS, -1, dtype=np.int8)
        best_cost = np.full(PAIRS, np.iinfo(np.int64).max, dtype=np.int64)
        best_ov = np.full(PAIRS, 255, dtype=np.uint8)
        for s in sorted(p.placements, reverse=True):
            pm = span(p.memory_slices, s)
            ok = (busy & pm) == 0
            cost = self.fragcost_q[(busy | pm) & 0xFF]
            ov = _POP[idle & pm]
            better = ok & ((cost < best_cost) | ((cost == best_cost) & (ov < best_ov)))
            best_start[better] = s
            best_cost[better] = cost[better]
            best_ov[better] = ov[better]
        out = (best_start, best_cost, best_ov)
        for arr in out:
            arr.setflags(write=False)
        self._best[i] = out
        return out

    def frag_slices(self, weights: dict[str, float]) -> npt.NDArray[np.float64]:
        """Per mask: expected free slices the demand mix cannot use (FGD-style, weights = request shares)."""
        total = sum(w for n, w in weights.items() if n in self.index)
        out = np.zeros(MASKS, dtype=np.float64)
        if total <= 0:
            return out
        for name, w in weights.items():
            if name not in self.index or w <= 0:
                continue
            i = self.index[name]
            out += (w / total) * (self.free_slices - self.pack_slices[:, i])
        return out


@functools.cache
def tables_for(model: GpuModel) -> ModelTables:
    return ModelTables(model)
