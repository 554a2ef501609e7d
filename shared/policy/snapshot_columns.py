"""Per-GPU rows of the snapshot's starts and planner columns, computed from one GPU's instances.

Shared by ``ClusterSnapshot`` (which derives a column lazily for a hand-built snapshot) and
``SnapshotBuilder`` (which keeps them incrementally), so both give the same integers.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel
from shared.mig.tables import tables_for
from shared.policy.gpu_view import GpuView


def fill_idle_starts(row: npt.NDArray[np.uint8], gpu: GpuView, index: Mapping[str, int]) -> None:
    fill_starts(row, gpu, index, busy=False)


def fill_busy_starts(row: npt.NDArray[np.uint8], gpu: GpuView, index: Mapping[str, int]) -> None:
    fill_starts(row, gpu, index, busy=True)


def fill_starts(row: npt.NDArray[np.uint8], gpu: GpuView, index: Mapping[str, int], *, busy: bool) -> None:
    row[:] = 0
    for inst in gpu.instances:
        if inst.busy == busy and inst.profile in index:
            row[index[inst.profile]] |= 1 << inst.start


def movable_drop_row(model: GpuModel, busy: int, starts: list[int], width: int) -> list[int]:
    """``movable_drops`` of one GPU: per profile index, ``removal_by_starts(model, profile)[busy << 8 |
    starts]`` computed directly (the same integers; the snapshot cannot import the planner's tables)."""
    cost = fragcost_list(model)
    row = [0] * width
    for k, bits in enumerate(starts):
        if not bits or k >= len(model.profiles):
            continue
        size = model.profiles[k].memory_slices
        best = 0
        for st in range(model.memory_slices - size + 1):
            if (bits >> st) & 1:
                best = min(best, cost[busy & ~(((1 << size) - 1) << st)] - cost[busy])
        row[k] = best
    return row


@functools.cache
def fragcost_list(model: GpuModel) -> list[int]:
    return [int(v) for v in tables_for(model).fragcost_q]


def fill_movable_starts(row: npt.NDArray[np.uint8], gpu: GpuView, index: Mapping[str, int]) -> None:
    row[:] = 0
    for inst in gpu.instances:
        if inst.busy and inst.migratable and not inst.latency_sensitive and inst.profile in index:
            row[index[inst.profile]] |= 1 << inst.start
