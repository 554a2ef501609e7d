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


DROP_ROWS = 1 << 16
"""Rows ``movable_drop_row_of`` keeps by default: the simulator's long runs over one cluster meet tens of
thousands of (busy mask, movable starts) pairs and ask each again and again."""
SERVICE_DROP_ROWS = 2048
"""What a service keeps (``size_drop_rows``): its snapshots are read anew from Redis, and new pairs keep coming
for as long as it runs; at this size a loop of 1,500 plans over 512 random GPUs ran at a flat RSS."""
_drop_rows: dict[tuple[GpuModel, int, tuple[int, ...], int], tuple[int, ...]] = {}
_drop_rows_cap = DROP_ROWS


def size_drop_rows(size: int) -> None:
    """Keep at most ``size`` rows (emptied when full). A service that reads a fresh snapshot every plan meets
    new pairs for as long as it runs: at the default its cache was the migration planner's RSS growth over a
    10-minute soak (+7 % in a loop of 1,500 plans over 512 random GPUs, 16,000 rows; flat at 2,048)."""
    global _drop_rows_cap
    if size < 1:
        raise ValueError("size must be at least 1")
    _drop_rows_cap = size
    _drop_rows.clear()


def movable_drop_row_of(model: GpuModel, busy: int, starts: tuple[int, ...], width: int) -> tuple[int, ...]:
    """``movable_drop_row``, memoised: a cluster shows few distinct (busy mask, movable starts) pairs."""
    key = (model, busy, starts, width)
    row = _drop_rows.get(key)
    if row is None:
        if len(_drop_rows) >= _drop_rows_cap:
            _drop_rows.clear()
        row = _drop_rows[key] = tuple(movable_drop_row(model, busy, list(starts), width))
    return row


@functools.cache
def fragcost_list(model: GpuModel) -> list[int]:
    return [int(v) for v in tables_for(model).fragcost_q]


def fill_movable_starts(row: npt.NDArray[np.uint8], gpu: GpuView, index: Mapping[str, int]) -> None:
    row[:] = 0
    for inst in gpu.instances:
        if inst.busy and inst.migratable and not inst.latency_sensitive and inst.profile in index:
            row[index[inst.profile]] |= 1 << inst.start
