"""Static layouts for the static baselines: ``mix`` sizes a fixed partitioning to the workload's demand.

NVIDIA's ``all-balanced`` (1g x2 + 2g + 3g) has no full-GPU instance, so a static cluster laid out that way
can
never run a 7g or multi-GPU job. An operator who partitions statically sizes the layouts to the known demand
instead; ``mix`` does that with hindsight (an oracle for the static baselines): GPUs are split between
single-shape layouts in proportion to the compute-slice-seconds each shape asks for over the whole workload,
the full-GPU layouts first so that whole nodes hold them (multi-GPU gangs need n on one node).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from shared.mig.geometry import Geometry, GpuModel
from shared.mig.occupancy import Layout, fit_mix
from shared.policy.snapshot import GpuView
from shared.sim.jobs import Workload

if TYPE_CHECKING:
    from shared.sim.cluster import SimCluster

# per shape: the mix of one GPU given to that shape (leftover slices get the next smaller shape)
_KINDS: dict[str, dict[str, int]] = {
    "7g": {"7g": 1},
    "4g": {"4g": 1, "3g": 1},
    "3g": {"3g": 2},
    "2g": {"2g": 3, "1g": 1},
    "1g.2x": {"1g.2x": 4},
    "1g": {"1g": 7},
}
_ORDER = ("7g", "4g", "3g", "2g", "1g.2x", "1g")


def _layout(model: GpuModel, kind: str) -> Layout | None:
    by_shape = {p.shape: p.name for p in model.profiles}
    mix = {by_shape[s]: n for s, n in _KINDS[kind].items() if s in by_shape}
    return fit_mix(model, mix) if mix else None


def demand_by_shape(workload: Workload) -> dict[str, float]:
    """Compute-slice-seconds asked per shape (a 4-GPU job counts four 7g)."""
    out: dict[str, float] = {}
    for j in workload.jobs:
        slices = 7 if j.shape == "7g" else int(j.shape[0])
        out[j.shape] = out.get(j.shape, 0.0) + slices * j.duration * j.gpus
    return out


def mix_layouts(
    gpus: Sequence[GpuView], models: dict[str, GpuModel], workload: Workload
) -> dict[str, Layout]:
    demand = {s: d for s, d in demand_by_shape(workload).items() if s in _KINDS and d > 0}
    total = sum(demand.values()) or 1.0
    n = len(gpus)
    quota = {s: demand.get(s, 0.0) / total * n for s in _ORDER}
    count = {s: int(q) for s, q in quota.items()}
    # largest remainder, then make sure every requested shape gets at least one GPU when there are enough
    for s in sorted(_ORDER, key=lambda s: (-(quota[s] - count[s]), _ORDER.index(s))):
        if sum(count.values()) >= n:
            break
        if quota[s] > 0:
            count[s] += 1
    for s in _ORDER:
        if demand.get(s, 0) > 0 and count[s] == 0:
            donor = max(_ORDER, key=lambda d: (count[d], -_ORDER.index(d)))
            if count[donor] > 1:
                count[donor] -= 1
                count[s] += 1
    kinds: list[str] = [s for s in _ORDER for _ in range(count[s])]
    kinds += ["1g"] * (n - len(kinds))
    out: dict[str, Layout] = {}
    for gpu, kind in zip(gpus, kinds, strict=False):
        model = models[gpu.model]
        layout = _layout(model, kind) or _layout(model, "1g")
        out[gpu.id] = layout or ()
    return out


def lay_out(cluster: SimCluster, geometry: Geometry, name: str | None, workload: Workload) -> dict[str, Layout]:
    """Apply the initial layout ``name`` (``mix``, or a ``static_layout`` name; None or empty: none) to every GPU of
    ``cluster`` as idle instances; returns each GPU's layout (what a static baseline restores)."""
    if not name:
        return {}
    gpus = list(cluster.views.values())
    if name == "mix":
        layouts = mix_layouts(gpus, {g.model: geometry.model(g.model) for g in gpus}, workload)
    else:
        from shared.policy.static_layouts import static_layout

        layouts = {gpu.id: static_layout(geometry.model(gpu.model), name) for gpu in gpus}
    for gpu in gpus:
        for prof, start in layouts[gpu.id]:
            cluster.add_idle(gpu.id, prof, start, f"{gpu.id}:{prof}@{start}:static")
    return layouts
