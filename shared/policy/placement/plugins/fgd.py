"""FGD (Weng et al., USENIX ATC'23, "Beware of Fragmentation"), as the authors' simulator scores nodes, applied
to MIG slices.

The *target workload* is a set of typical pods with their popularity: here every (MIG shape, GPU count) class
of the workload with its share of the jobs, taken with hindsight over the whole trace as in the paper
(``typical_pods``). A node's fragmentation against one typical pod ``(s, k)``:

- if at least ``k`` of its GPUs can each host ``s`` (for a multi-GPU pod: ``k`` empty GPUs), the free compute
  slices of the GPUs that cannot host ``s`` (the paper's Q2 "lack GPU" part of a satisfiable node);
- otherwise all of its free compute slices (the node cannot host the pod, so all its idle capacity is fragment).

The node's fragmentation is the popularity-weighted sum over the typical pods. A job goes to the node and
placement whose choice increases its node's fragmentation least; within that, the GPU and start that do
(FGD's per-GPU choice for a partial-GPU pod). A GPU can host a shape when a placement of it is free of busy
slices (idle instances are reclaimable). Ties go to reusing an idle instance, then to the first GPU in snapshot
order, then to the lowest start. ``gpus: n`` takes the node whose ``n`` empty GPUs cost least to fill.

Parameter ``pods``: typical pod key -> share (``typical_pods``); the simulator hands in the workload's.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span
from shared.policy.fragcost import UNIFORM_SHAPES
from shared.policy.placement.decision import Decision, JobRequest
from shared.policy.placement.explain import whole_placement
from shared.policy.placement.registry import PolicySpec, Rules, register
from shared.policy.placement.slots import (
    UnknownPolicyError,
    cannot_place,
    count_ok,
    create_slot,
    explained,
    full_slot,
    reuse_slot,
)
from shared.policy.request import Demand, full_profile, resolve_profile
from shared.policy.snapshot import ClusterSnapshot, GpuView

Pod = tuple[str, int]
"""A typical pod: (MIG shape per GPU, GPU count)."""


def typical_pods(demands: Iterable[tuple[str, int]]) -> dict[str, float]:
    """Popularity of each (shape, GPU count) class, keyed ``3g`` or ``7gx4``: the FGD target workload."""
    counts = Counter(f"{shape}x{k}" if k > 1 else shape for shape, k in demands)
    total = sum(counts.values())
    return {key: n / total for key, n in sorted(counts.items())} if total else {}


def _parse(pods: Mapping[str, float]) -> tuple[tuple[Pod, float], ...]:
    out = []
    for key, w in pods.items():
        shape, _, k = key.partition("x")
        if w > 0:
            out.append(((shape, int(k) if k else 1), float(w)))
    return tuple(out)


@functools.cache
def _hosts(model: GpuModel, shape: str) -> tuple[bool, ...]:
    """Per busy mask: whether a ``shape`` instance has a placement free of busy slices."""
    prof = resolve_profile(Demand(kind="mig", profile=shape), model)
    out = [False] * 256
    if prof is None:
        return tuple(out)
    masks = [span(prof.memory_slices, s) for s in prof.placements]
    for busy in range(256):
        out[busy] = any(not busy & m for m in masks)
    return tuple(out)


class _Node:
    """Per typical pod: GPUs that can host it and free compute on those that cannot; the node's free compute."""

    __slots__ = ("hosting", "lacking", "total")

    def __init__(self, pods: Sequence[tuple[Pod, float]], gpus: Sequence[tuple[GpuModel, int, int]]) -> None:
        self.hosting = [0] * len(pods)
        self.lacking = [0] * len(pods)
        self.total = 0
        for model, busy, free in gpus:
            self.add(pods, model, busy, free, 1)

    def add(self, pods: Sequence[tuple[Pod, float]], model: GpuModel, busy: int, free: int, sign: int) -> None:
        self.total += sign * free
        for q, ((shape, k), _) in enumerate(pods):
            ok = busy == 0 if k > 1 else _hosts(model, shape)[busy]
            if ok:
                self.hosting[q] += sign
            else:
                self.lacking[q] += sign * free

    def frag(self, pods: Sequence[tuple[Pod, float]]) -> float:
        return sum(w * (self.lacking[q] if self.hosting[q] >= k else self.total)
                   for q, ((_, k), w) in enumerate(pods))

    def frag_if(
        self, pods: Sequence[tuple[Pod, float]], changes: Sequence[tuple[GpuModel, int, int, int, int]]
    ) -> float:
        """The fragmentation after GPUs change (model, busy before, free before, busy after, free after)."""
        for model, b0, f0, b1, f1 in changes:
            self.add(pods, model, b0, f0, -1)
            self.add(pods, model, b1, f1, 1)
        out = self.frag(pods)
        for model, b0, f0, b1, f1 in changes:
            self.add(pods, model, b1, f1, -1)
            self.add(pods, model, b0, f0, 1)
        return out


def _nodes(snap: ClusterSnapshot, pods: Sequence[tuple[Pod, float]]) -> dict[str, _Node]:
    by: dict[str, list[tuple[GpuModel, int, int]]] = {}
    ok = snap.ok
    for p, g in enumerate(snap.gpus):
        if not ok[p]:
            continue
        model = snap.models[snap.model_list[snap.model_idx[p]].name]
        by.setdefault(g.node, []).append((model, g.busy_mask, model.compute_slices - g.used_compute))
    return {node: _Node(pods, gs) for node, gs in by.items()}


def fgd_rules(name: str, pods: Mapping[str, float]) -> Rules:
    parsed = _parse(pods)
    if not parsed:
        raise UnknownPolicyError(f"{name}: 'pods' needs at least one typical pod with a positive share")

    def mig(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        return _mig(snap, job, _nodes(snap, parsed), parsed, name)

    def gang(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        return _gang(snap, job, _nodes(snap, parsed), parsed, name)

    return Rules(mig=mig, gang=gang)


def _mig(
    snap: ClusterSnapshot, job: JobRequest, nodes: Mapping[str, _Node], pods: Sequence[tuple[Pod, float]],
    name: str,
) -> Decision:
    best: tuple[float, int, int, int, str | None, Profile] | None = None
    counts: Counter[str] = Counter()
    before: dict[str, float] = {}
    ok = snap.ok
    for p, gpu in enumerate(snap.gpus):
        if not ok[p]:
            counts["not in MIG mode or unhealthy"] += 1
            continue
        model = snap.models[snap.model_list[snap.model_idx[p]].name]
        prof = resolve_profile(job.demand, model)
        if prof is None:
            counts[f"{model.name} has no profile for {job.demand.label()}"] += 1
            continue
        node = nodes[gpu.node]
        if gpu.node not in before:
            before[gpu.node] = node.frag(pods)
        free0 = model.compute_slices - gpu.used_compute
        free1 = free0 - prof.compute_slices
        found = False
        for action, start, inst_id in _options(gpu, prof):
            found = True
            after = node.frag_if(pods, ((model, gpu.busy_mask, free0,
                                         gpu.busy_mask | span(prof.memory_slices, start), free1),))
            cand = (after - before[gpu.node], action, p, start, inst_id, prof)
            if best is None or cand[:4] < best[:4]:
                best = cand
        if not found:
            counts[f"no free {prof.name} placement"] += 1
    if best is None:
        return cannot_place(job, name, counts)
    delta, _, p, start, inst_id, prof = best
    gpu = snap.gpus[p]
    model = snap.models[snap.model_list[snap.model_idx[p]].name]
    why = f"{name}: least increase of node {gpu.node}'s fragmentation against the target workload ({delta:+.2f})"
    slot = reuse_slot(gpu, model, inst_id) if inst_id is not None else create_slot(gpu, model, prof, start)
    return explained(snap, job, name, slot, why)


def _options(gpu: GpuView, prof: Profile) -> list[tuple[int, int, str | None]]:
    """(0 reuse / 1 create, start, idle instance id) for each legal way to put ``prof`` on the GPU."""
    out: list[tuple[int, int, str | None]] = [
        (0, i.start, i.id) for i in gpu.instances if i.job_id is None and i.profile == prof.name]
    for s in prof.placements:
        pm = span(prof.memory_slices, s)
        if not gpu.busy_mask & pm and count_ok(gpu, prof, pm):
            out.append((1, s, None))
    return out


def _gang(
    snap: ClusterSnapshot, job: JobRequest, nodes: Mapping[str, _Node], pods: Sequence[tuple[Pod, float]],
    name: str,
) -> Decision:
    n = job.demand.gpus
    empty: dict[str, list[tuple[int, GpuView]]] = {}
    ok = snap.ok
    for p, g in enumerate(snap.gpus):
        if ok[p] and not g.busy_mask:
            empty.setdefault(g.node, []).append((p, g))
    best: tuple[float, int, str] | None = None
    for node, gs in empty.items():
        if len(gs) < n:
            continue
        changes = []
        for p, g in gs[:n]:
            model = snap.models[snap.model_list[snap.model_idx[p]].name]
            full = full_profile(model)
            free0 = model.compute_slices - g.used_compute
            changes.append((model, 0, free0, span(full.memory_slices, 0), free0 - full.compute_slices))
        d = nodes[node].frag_if(pods, changes) - nodes[node].frag(pods)
        cand = (d, gs[0][0], node)
        if best is None or cand < best:
            best = cand
    if best is None:
        most = max((len(v) for v in empty.values()), default=0)
        return cannot_place(job, name, {f"no node has {n} empty GPU(s); the most on one node is {most}": len(snap)})
    slots = tuple(full_slot(g, snap.geometry.model(g.model)) for _, g in empty[best[2]][:n])
    return whole_placement(job, slots, name)


@register(PolicySpec(name="fgd", description="FGD (Weng et al., ATC'23): least increase of the node's "
                     "fragmentation against the target workload's typical pods, multi-GPU pods included"),
          accepts=("pods",))
def _build(spec: PolicySpec, params: dict[str, Any]) -> tuple[PolicySpec, Rules]:
    return spec, fgd_rules(spec.name, params.get("pods") or UNIFORM_SHAPES)
