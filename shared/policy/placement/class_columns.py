"""``ClassColumns``: the positions and static keys of ``AlignIndex``'s large classes, kept as arrays between
decisions.

A decision reads its best class's GPUs as two arrays (positions, sorted, and their static keys). On a cluster of
thousands of GPUs that class can hold thousands, and building the arrays from the class's set at every decision
costs more than the decision (a sort and a Python pass over every member). Yet a decision changes only the few
GPUs it placed on or freed. So a class of at least ``min_size`` GPUs keeps its arrays, and the index reports
each GPU that joins it, leaves it or is re-keyed within it; the next read gives a GPU re-keyed within the class
its current key in place, drops those that left and inserts those that joined, or builds the arrays afresh when
more than an eighth of the class changed. Smaller classes are built at every read, which costs less than keeping
them.
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
            sel, base = _patch(sel, base, sorted(touched), members, keys, j)
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


def _patch(sel: npt.NDArray[np.intp], base: npt.NDArray[np.int64], touched: list[int], members: set[int],
           keys: Sequence[tuple[int, ...]], j: int) -> Columns:
    """``sel`` and ``base`` with the ``touched`` positions (sorted) brought up to date: a member already listed
    gets its current key in place, one listed that left is dropped, a member not listed is inserted in order.
    One ``searchsorted`` over the few touched positions; ``np.isin`` sorts both arrays."""
    pos = np.asarray(touched, dtype=np.intp)
    at = sel.searchsorted(pos)
    listed = at < len(sel)
    listed[listed] = sel[at[listed]] == pos[listed]
    rekey_at: list[int] = []
    rekey: list[int] = []
    drop: list[int] = []
    add: list[int] = []
    for p, i, there in zip(touched, at.tolist(), listed.tolist(), strict=True):
        if p not in members:
            if there:
                drop.append(i)
        elif there:
            rekey_at.append(i)
            rekey.append(keys[p][j])
        else:
            add.append(p)
    if rekey_at:
        base = base.copy()
        base[rekey_at] = rekey
    if drop:
        keep = np.ones(len(sel), dtype=bool)
        keep[drop] = False
        sel, base = sel[keep], base[keep]
    if add:
        at = sel.searchsorted(add)
        sel = np.insert(sel, at, add)
        base = np.insert(base, at, [keys[p][j] for p in add])
    return sel, base
