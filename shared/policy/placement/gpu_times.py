"""``GpuTimes``: what the time fields of ``AlignIndex``'s keys read, kept one GPU change at a time.

Per GPU its expected free time, its busy compute slices and whether it is usable and empty; per node the latest
expected free time of its GPUs and its usable empty GPUs. Most decisions key a handful of GPUs one at a time
(``trailing_one``) and read these as Python lists, where a numpy element read costs more than the arithmetic.
A decision over a large class reads them as arrays (``trailing``, ``gang_head``), so the arrays are brought up
to date only then, for the GPUs and nodes changed since the last such decision. ``number_nodes`` numbers the
nodes these aggregates are kept by.

Pure: a data structure the index drives; no clock, I/O or randomness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shared.policy.gpu_view import GpuView


class GpuTimes:
    def __init__(self, node_of: list[int], node_at: list[list[int]]) -> None:
        n, nodes = len(node_of), len(node_at)
        self.node_of, self.node_at = node_of, node_at
        self.end = [-math.inf] * n
        """Per GPU position: when it is expected to be free (``cluster_snapshot.gpu_end``)."""
        self.used = [0] * n
        """Per GPU position: its busy compute slices."""
        self.empty = [False] * n
        """Per GPU position: usable (MIG mode, healthy) with no busy instance."""
        self.node_last = [-math.inf] * nodes
        """Per node number: its GPUs' latest expected free time."""
        self.node_count = [0] * nodes
        """Per node number: its usable empty GPUs."""
        self.columns: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int64],
                            npt.NDArray[np.int64]] = (np.full(n, -math.inf), np.full(n, -math.inf),
                                                      np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64))
        """The same per GPU position as arrays: expected free time, its node's, its node's empty GPUs, busy
        compute slices. Always these objects (a decision's context holds them); up to date after ``flush``."""
        self._stale: set[int] = set()
        self._stale_nodes: set[int] = set()

    def put(self, pos: int, end: float, used: int, empty: bool) -> None:
        """GPU ``pos`` now ends at ``end`` with ``used`` compute slices busy; its node is settled later
        (``settle``)."""
        self.end[pos], self.used[pos], self.empty[pos] = end, used, empty
        self._stale.add(pos)

    def settle(self, nodes: set[int]) -> None:
        """Recompute the aggregates of ``nodes`` (those of the GPUs ``put`` since the last call)."""
        end_of, empty_of, last, count = self.end, self.empty, self.node_last, self.node_count
        for nid in nodes:
            at = self.node_at[nid]
            end = max([end_of[p] for p in at])
            empty = sum([empty_of[p] for p in at])
            if end != last[nid] or empty != count[nid]:
                last[nid], count[nid] = end, empty
                self._stale_nodes.add(nid)

    def flush(self) -> None:
        """Bring ``columns`` up to date."""
        ends, node_end, node_empty, used = self.columns
        if self._stale:
            for p in self._stale:
                ends[p] = self.end[p]
                used[p] = self.used[p]
            self._stale.clear()
        if self._stale_nodes:
            for nid in self._stale_nodes:
                end, empty = self.node_last[nid], self.node_count[nid]
                for p in self.node_at[nid]:
                    node_end[p] = end
                    node_empty[p] = empty
            self._stale_nodes.clear()


def number_nodes(gpus: Sequence[GpuView]) -> tuple[dict[str, int], list[int], list[list[int]]]:
    """Node name -> node number, each GPU's node number, and per node number its GPUs' positions in order."""
    nodes: dict[str, int] = {}
    node_of: list[int] = []
    node_at: list[list[int]] = []
    for p, g in enumerate(gpus):
        nid = nodes.get(g.node)
        if nid is None:
            nid = nodes[g.node] = len(node_at)
            node_at.append([])
        node_of.append(nid)
        node_at[nid].append(p)
    return nodes, node_of, node_at
