"""The FGD rule as a plain loop over nodes, GPUs and options: the reference the vectorised policy
(``shared.policy.placement.plugins.fgd``) is checked against. Popularities are the policy's fixed-point ones
(``Target``), so that both sum the same integers.

``choose`` returns the chosen (GPU id, start, action) of a MIG request or None; ``choose_gang`` the GPU ids of a
gang of whole GPUs on one node, or None; ``node_frag`` each node's fragmentation."""

from __future__ import annotations

from collections.abc import Sequence

from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span
from shared.policy.placement.decision import JobRequest
from shared.policy.placement.plugins.fgd import Target
from shared.policy.placement.slots import count_ok
from shared.policy.request import Demand, full_profile, resolve_profile
from shared.policy.snapshot import ClusterSnapshot, GpuView


def _hosts(model: GpuModel, shape: str, busy: int) -> bool:
    prof = resolve_profile(Demand(kind="mig", profile=shape), model)
    return prof is not None and any(not busy & span(prof.memory_slices, s) for s in prof.placements)


class _Node:
    def __init__(self, target: Target) -> None:
        self.pods = list(zip(target.pods, target.weights.tolist(), strict=True))
        self.hosting = [0] * len(self.pods)
        self.lacking = [0] * len(self.pods)
        self.total = 0

    def add(self, model: GpuModel, busy: int, free: int, sign: int) -> None:
        self.total += sign * free
        for q, ((shape, k), _) in enumerate(self.pods):
            if (busy == 0) if k > 1 else _hosts(model, shape, busy):
                self.hosting[q] += sign
            else:
                self.lacking[q] += sign * free

    def frag(self) -> int:
        return sum(w * (self.lacking[q] if self.hosting[q] >= k else self.total)
                   for q, ((_, k), w) in enumerate(self.pods))

    def frag_if(self, changes: Sequence[tuple[GpuModel, int, int, int, int]]) -> int:
        for model, b0, f0, b1, f1 in changes:
            self.add(model, b0, f0, -1)
            self.add(model, b1, f1, 1)
        out = self.frag()
        for model, b0, f0, b1, f1 in changes:
            self.add(model, b1, f1, -1)
            self.add(model, b0, f0, 1)
        return out


def _model(snap: ClusterSnapshot, gpu: GpuView) -> GpuModel:
    return snap.models[gpu.model]


def nodes(snap: ClusterSnapshot, target: Target) -> dict[str, _Node]:
    out: dict[str, _Node] = {}
    for p, g in enumerate(snap.gpus):
        if snap.ok[p]:
            model = _model(snap, g)
            out.setdefault(g.node, _Node(target)).add(model, g.busy_mask, model.compute_slices - g.used_compute, 1)
    return out


def node_frag(snap: ClusterSnapshot, target: Target) -> dict[str, int]:
    return {name: node.frag() for name, node in nodes(snap, target).items()}


def _options(gpu: GpuView, prof: Profile) -> list[tuple[int, int, str | None]]:
    out: list[tuple[int, int, str | None]] = [
        (0, i.start, i.id) for i in gpu.instances if i.job_id is None and i.profile == prof.name]
    for s in prof.placements:
        pm = span(prof.memory_slices, s)
        if not gpu.busy_mask & pm and count_ok(gpu, prof, pm):
            out.append((1, s, None))
    return out


def choose(snap: ClusterSnapshot, job: JobRequest, target: Target) -> tuple[str, int, str] | None:
    by_node = nodes(snap, target)
    best: tuple[int, int, int, int] | None = None
    for p, gpu in enumerate(snap.gpus):
        if not snap.ok[p]:
            continue
        model = _model(snap, gpu)
        prof = resolve_profile(job.demand, model)
        if prof is None:
            continue
        node = by_node[gpu.node]
        before = node.frag()
        free0 = model.compute_slices - gpu.used_compute
        for action, start, _ in _options(gpu, prof):
            after = node.frag_if(((model, gpu.busy_mask, free0, gpu.busy_mask | span(prof.memory_slices, start),
                                   free0 - prof.compute_slices),))
            cand = (after - before, action, p, start)
            if best is None or cand < best:
                best = cand
    if best is None:
        return None
    _, action, p, start = best
    return snap.gpus[p].id, start, ("reuse", "create")[action]


def choose_gang(snap: ClusterSnapshot, n: int, target: Target) -> list[str] | None:
    by_node = nodes(snap, target)
    empty: dict[str, list[tuple[int, GpuView]]] = {}
    for p, g in enumerate(snap.gpus):
        if snap.ok[p] and not g.busy_mask:
            empty.setdefault(g.node, []).append((p, g))
    best: tuple[int, int, str] | None = None
    for name, gs in empty.items():
        if len(gs) < n:
            continue
        changes = []
        for _, g in gs[:n]:
            model = _model(snap, g)
            full = full_profile(model)
            free0 = model.compute_slices - g.used_compute
            changes.append((model, 0, free0, span(full.memory_slices, 0), free0 - full.compute_slices))
        cand = (by_node[name].frag_if(changes) - by_node[name].frag(), gs[0][0], name)
        if best is None or cand < best:
            best = cand
    return None if best is None else [g.id for _, g in empty[best[2]][:n]]
