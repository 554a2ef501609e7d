"""``ClassColumns``: the positions and static keys of ``AlignIndex``'s large classes, kept as arrays between
decisions.

A decision reads its best class's GPUs as two arrays (positions, sorted, and their static keys). On a cluster of
thousands of GPUs that class can hold thousands, and building the arrays from the class's set at every decision
costs more than the decision (a sort and a Python pass over every member). Yet a decision changes only the few
GPUs it placed on or freed. So a class of at least ``min_size`` GPUs keeps its arrays, and the index reports
each GPU that joins it, leaves it or is re-keyed within it; the next read drops those positions and puts back
the ones still in the class with their current key, or builds the arrays afresh when more than an eighth of the
class changed. Smaller classes are built at every read, which costs less than keeping them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Key = tuple[int, int, int]
"""A class: (model slot, profile column, leading fields)."""
Columns = tuple[npt.NDArray[np.intp], npt.NDArray[np.int64]]


class ClassColumns:
    def __init__(self, min_size: int = 64) -> None:
        self.min_size = min_size
        self.kept_now: dict[Key, tuple[npt.NDArray[np.intp], npt.NDArray[np.int64], set[int]]] = {}
        """Per class kept: its arrays and the positions touched since they were built. The index adds each GPU
        that joins a kept class, leaves it (while it still holds others) or is re-keyed within it to that set
        itself: it does so for every GPU it re-keys, where a method call per class costs measurably."""

    def emptied(self, cls: Key) -> None:
        """``cls`` holds no GPU any more."""
        self.kept_now.pop(cls, None)

    def read(self, cls: Key, members: set[int], keys: Sequence[tuple[int, ...]]) -> Columns:
        """The class's positions (sorted) and each one's static key (``keys[pos][profile column]``)."""
        j = cls[1]
        large = len(members) >= self.min_size
        kept = self.kept_now.get(cls) if large else None
        if kept is None or len(kept[2]) > max(8, len(members) // 8):
            ordered = sorted(members)
            sel = np.array(ordered, dtype=np.intp)
            base = np.array([keys[p][j] for p in ordered], dtype=np.int64)
            if large:
                self._keep(cls, sel, base)
            return sel, base
        sel, base, touched = kept
        if touched:
            keep = ~np.isin(sel, np.fromiter(touched, dtype=np.intp, count=len(touched)))
            sel, base = sel[keep], base[keep]
            back = sorted(p for p in touched if p in members)
            if back:
                at = np.searchsorted(sel, back)
                sel = np.insert(sel, at, back)
                base = np.insert(base, at, [keys[p][j] for p in back])
            self._keep(cls, sel, base)
        return sel, base

    def kept(self) -> list[Key]:
        """The classes whose arrays are kept."""
        return list(self.kept_now)

    def _keep(self, cls: Key, sel: npt.NDArray[np.intp], base: npt.NDArray[np.int64]) -> None:
        # read-only: a decision's groups hold them, and nothing may change them under the next read
        sel.setflags(write=False)
        base.setflags(write=False)
        self.kept_now[cls] = (sel, base, set())
