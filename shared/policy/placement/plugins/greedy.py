"""The simple greedy baselines: rank the GPUs that fit, take the first, place on it.

- ``first-fit``: the first GPU in snapshot order that fits, lowest legal start.
- ``best-fit``: the fitting GPU with the fewest free memory slices (idle ones count as free), lowest start.
- ``spread``: worst-fit, the fitting GPU with the most free slices, lowest start.
- ``driver-default``: the first GPU that fits, highest start (the driver's habit without a placement).

Each reuses an idle instance of the exact profile when the GPU it chose has one (lowest start; highest for
``driver-default``); otherwise it creates one, preferring a start that destroys no idle instance. Whole GPUs and
time-sliced shares go the way every policy shares (``rules``). Vectorised over the snapshot columns with
per-model look-up tables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span
from shared.mig.tables import popcount_table, tables_for
from shared.policy.placement.decision import Decision, JobRequest
from shared.policy.placement.registry import PolicySpec, Rules, register
from shared.policy.placement.slots import (
    cannot_place,
    column,
    count_ok,
    create_slot,
    explained,
    idle_instance,
    model_groups,
    reuse_slot,
    start_table,
)
from shared.policy.snapshot import ClusterSnapshot

Ranker = Callable[[ClusterSnapshot, npt.NDArray[np.intp], GpuModel], npt.NDArray[np.int64]]


def _rank_first(snap: ClusterSnapshot, pos: npt.NDArray[np.intp], model: GpuModel) -> npt.NDArray[np.int64]:
    return pos.astype(np.int64)


def _free(snap: ClusterSnapshot, pos: npt.NDArray[np.intp], model: GpuModel) -> npt.NDArray[np.int64]:
    return model.memory_slices - popcount_table()[snap.busy[pos]].astype(np.int64)


def _rank_best(snap: ClusterSnapshot, pos: npt.NDArray[np.intp], model: GpuModel) -> npt.NDArray[np.int64]:
    return (_free(snap, pos, model) << 40) + pos


def _rank_spread(snap: ClusterSnapshot, pos: npt.NDArray[np.intp], model: GpuModel) -> npt.NDArray[np.int64]:
    return ((8 - _free(snap, pos, model)) << 40) + pos


def greedy(name: str, rank: Ranker, highest: bool) -> Rules:
    """Rank the GPUs that fit a MIG request by ``rank`` (lowest first) and place on the chosen one."""

    def mig(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        excluded: set[int] = set()
        at_max = 0
        while True:
            counts: dict[str, int] = {}
            if at_max:
                counts[f"{job.demand.label()} at its max count"] = at_max
            best: tuple[int, int, GpuModel, Profile] | None = None
            for model, prof, pos, ok in model_groups(snap, job, counts):
                bit = np.uint32(1 << tables_for(model).index[prof.name])
                pair = (column(snap.busy)[pos].astype(np.intp) << 8) | column(snap.idle)[pos]
                starts = start_table(model, prof.name, highest)[pair]
                fits = ok & ((column(snap.idle_profiles)[pos] & bit) != 0) | (ok & (starts >= 0))
                if excluded:
                    fits &= ~np.isin(pos, list(excluded))
                counts[f"no free {prof.name} placement"] = int((ok & ~fits).sum())
                if not fits.any():
                    continue
                keys = rank(snap, pos[fits], model)
                i = int(np.argmin(keys))
                cand = (int(keys[i]), int(pos[fits][i]), model, prof)
                if best is None or cand[:2] < best[:2]:
                    best = cand
            if best is None:
                return cannot_place(job, name, counts)
            _, p, model, prof = best
            gpu = snap.gpus[p]
            inst_id = idle_instance(gpu, prof, highest)
            if inst_id is not None:
                return explained(snap, job, name, reuse_slot(gpu, model, inst_id), f"{name}: GPU {gpu.id}")
            start = int(start_table(model, prof.name, highest)[gpu.busy_mask << 8 | gpu.idle_mask])
            if count_ok(gpu, prof, span(prof.memory_slices, start)):
                return explained(snap, job, name, create_slot(gpu, model, prof, start), f"{name}: GPU {gpu.id}")
            at_max += 1
            excluded.add(p)

    return Rules(mig=mig)


def _registered(name: str, description: str, rank: Ranker, highest: bool) -> None:
    @register(PolicySpec(name=name, description=description))
    def _build(spec: PolicySpec, params: dict[str, Any]) -> tuple[PolicySpec, Rules]:
        return spec, greedy(spec.name, rank, highest)


_registered("first-fit", "first GPU in snapshot order that fits, lowest legal start", _rank_first, False)
_registered("best-fit", "fitting GPU with the fewest free memory slices, lowest start", _rank_best, False)
_registered("spread", "worst-fit: fitting GPU with the most free memory slices, lowest start", _rank_spread, False)
_registered("driver-default", "first GPU that fits, highest-index start (NVIDIA driver's habit)", _rank_first, True)
