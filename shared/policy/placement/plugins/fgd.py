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

Popularities are fixed-point integers (``Target.SCALE``), so that every score is exact and equal scores tie
exactly, whatever order they are summed in. A decision is vectorised: the nodes' per-pod counts from a table of
which busy masks host which pod, then every (GPU, start) scored at once from its node's counts;
``tests/reference_fgd.py`` is the same rule as a plain loop over GPUs and options.

Parameter ``pods``: typical pod key -> share (``typical_pods``); the simulator hands in the workload's.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel
from shared.mig.occupancy import span
from shared.mig.tables import tables_for
from shared.policy.fragcost import UNIFORM_SHAPES
from shared.policy.placement.decision import Decision, JobRequest
from shared.policy.placement.explain import whole_placement
from shared.policy.placement.registry import PolicySpec, Rules, register
from shared.policy.placement.sharing import no_node_has
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
from shared.policy.snapshot import ClusterSnapshot

Pod = tuple[str, int]
"""A typical pod: (MIG shape per GPU, GPU count)."""
Ints = npt.NDArray[np.int64]


def typical_pods(demands: Iterable[tuple[str, int]]) -> dict[str, float]:
    """Popularity of each (shape, GPU count) class, keyed ``3g`` or ``7gx4``: the FGD target workload."""
    counts = Counter(f"{shape}x{k}" if k > 1 else shape for shape, k in demands)
    total = sum(counts.values())
    return {key: n / total for key, n in sorted(counts.items())} if total else {}


class Target:
    """The target workload parsed: its typical pods, each pod's GPU count and its popularity in units of
    ``1 / SCALE``."""

    SCALE = 1 << 30

    def __init__(self, pods: Mapping[str, float]) -> None:
        parsed = []
        for key, w in pods.items():
            shape, _, k = key.partition("x")
            weight = round(float(w) * self.SCALE)
            if weight > 0:
                parsed.append(((shape, int(k) if k else 1), weight))
        self.pods: tuple[Pod, ...] = tuple(p for p, _ in parsed)
        self.weights: Ints = np.array([w for _, w in parsed], dtype=np.int64)
        self.k: Ints = np.array([k for _, k in self.pods], dtype=np.int64)

    def hosts(self, model: GpuModel) -> npt.NDArray[np.bool_]:
        """Per busy mask (256 rows) and typical pod: whether a GPU of ``model`` in that state can host it."""
        return _hosts(model, self.pods)


@functools.cache
def _hosts(model: GpuModel, pods: tuple[Pod, ...]) -> npt.NDArray[np.bool_]:
    out = np.zeros((256, len(pods)), dtype=bool)
    busy = np.arange(256)
    for q, (shape, k) in enumerate(pods):
        if k > 1:  # a multi-GPU pod takes whole GPUs
            out[:, q] = busy == 0
            continue
        prof = resolve_profile(Demand(kind="mig", profile=shape), model)
        if prof is not None:
            for s in prof.placements:
                out[:, q] |= (busy & span(prof.memory_slices, s)) == 0
    out.setflags(write=False)
    return out


class Nodes:
    """Per node of a snapshot (its usable GPUs only): per typical pod, the GPUs that can host it and the free
    compute slices of those that cannot; and all its free compute slices."""

    def __init__(self, snap: ClusterSnapshot, target: Target) -> None:
        self.target = target
        self.node = np.asarray(snap.node_idx)
        n, q = int(self.node.max()) + 1 if len(self.node) else 0, len(target.pods)
        self.hosting: Ints = np.zeros((n, q), dtype=np.int64)
        self.lacking: Ints = np.zeros((n, q), dtype=np.int64)
        self.total: Ints = np.zeros(n, dtype=np.int64)
        busy, used, ok = np.asarray(snap.busy).astype(np.intp), np.asarray(snap.used).astype(np.int64), snap.ok
        self.free: Ints = np.zeros(len(self.node), dtype=np.int64)
        for name, pos in snap.groups.items():
            model = snap.models[name]
            pos = pos[ok[pos]]
            h = target.hosts(model)[busy[pos]]
            free = model.compute_slices - used[pos]
            self.free[pos] = free
            at = self.node[pos]
            np.add.at(self.hosting, at, h.astype(np.int64))
            np.add.at(self.lacking, at, np.where(h, 0, free[:, None]))
            np.add.at(self.total, at, free)
        self.frag = self.score(self.hosting, self.lacking, self.total)
        """Per node: its fragmentation, in units of ``1 / Target.SCALE`` free compute slices."""

    def score(self, hosting: Ints, lacking: Ints, total: Ints) -> Ints:
        """The fragmentation of nodes with these counts (one row each)."""
        return (np.where(hosting >= self.target.k, lacking, total[:, None]) * self.target.weights).sum(axis=-1)

    def after(self, at: Ints, h0: npt.NDArray[np.bool_], f0: Ints, h1: npt.NDArray[np.bool_], f1: Ints) -> Ints:
        """The fragmentation of nodes ``at`` once one GPU of each changes from hosting ``h0`` with ``f0`` free
        compute slices to hosting ``h1`` with ``f1`` (one row per change)."""
        hosting = self.hosting[at] - h0 + h1
        lacking = self.lacking[at] - np.where(h0, 0, f0[:, None]) + np.where(h1, 0, f1[:, None])
        return self.score(hosting, lacking, self.total[at] - f0 + f1)


def fgd_rules(name: str, pods: Mapping[str, float]) -> Rules:
    target = Target(pods)
    if not target.pods:
        raise UnknownPolicyError(f"{name}: 'pods' needs at least one typical pod with a positive share")

    def mig(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        return _mig(snap, job, Nodes(snap, target), name)

    def gang(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        return _gang(snap, job, Nodes(snap, target), name)

    return Rules(mig=mig, gang=gang)


def _mig(snap: ClusterSnapshot, job: JobRequest, nodes: Nodes, name: str) -> Decision:
    """Every (GPU, start) free of busy slices scored at once, taken in (increase, reuse first, GPU, start)
    order; a new instance past its profile's max count is passed over."""
    counts: Counter[str] = Counter()
    ok = snap.ok
    counts["not in MIG mode or unhealthy"] = int((~ok).sum())
    busy = np.asarray(snap.busy).astype(np.int64)
    parts: list[tuple[Ints, Ints, Ints, Ints]] = []
    placeable: Counter[str] = Counter()
    """Per profile, the GPUs with a start free of busy slices."""
    for model_name, pos in snap.groups.items():
        model = snap.models[model_name]
        pos = pos[ok[pos]]
        prof = resolve_profile(job.demand, model)
        if prof is None:
            counts[f"{model.name} has no profile for {job.demand.label()}"] += len(pos)
            continue
        if not len(pos):
            continue
        hosts, at, b0 = nodes.target.hosts(model), nodes.node[pos], busy[pos]
        h0, f0 = hosts[b0], nodes.free[pos]
        f1 = f0 - prof.compute_slices
        reuse_bits = np.asarray(snap.idle_starts)[pos, tables_for(model).index[prof.name]].astype(np.int64)
        found = np.zeros(len(pos), dtype=bool)
        for s in prof.placements:
            pm = span(prof.memory_slices, s)
            free = (b0 & pm) == 0
            found |= free
            rows = np.flatnonzero(free)
            if not len(rows):
                continue
            delta = nodes.after(at[rows], h0[rows], f0[rows], hosts[b0[rows] | pm], f1[rows]) - nodes.frag[at[rows]]
            action = 1 - ((reuse_bits[rows] >> s) & 1)
            parts.append((delta, action, pos[rows].astype(np.int64), np.full(len(rows), s, dtype=np.int64)))
        counts[f"no free {prof.name} placement"] += int((~found).sum())
        placeable[f"no free {prof.name} placement"] += int(found.sum())
    if parts:
        delta, action, p, start = (np.concatenate(c) for c in zip(*parts, strict=True))
        for i in np.lexsort((start, p, action, delta)).tolist():
            decision = _slot(snap, job, name, int(p[i]), int(start[i]), int(action[i]), int(delta[i]))
            if decision is not None:
                return decision
        counts.update(placeable)  # every option was a new instance past its profile's max count
    return cannot_place(job, name, counts)


def _slot(snap: ClusterSnapshot, job: JobRequest, name: str, p: int, start: int, action: int, delta: int,
          ) -> Decision | None:
    """The decision for one option, or None for a new instance past its profile's max count."""
    gpu = snap.gpus[p]
    model = snap.models[gpu.model]
    prof = resolve_profile(job.demand, model)
    assert prof is not None  # an option exists only where the profile does
    why = (f"{name}: least increase of node {gpu.node}'s fragmentation against the target workload "
           f"({delta / Target.SCALE:+.2f})")
    if action == 0:
        inst = next(i for i in gpu.instances if i.job_id is None and i.profile == prof.name and i.start == start)
        return explained(snap, job, name, reuse_slot(gpu, model, inst.id), why)
    if not count_ok(gpu, prof, span(prof.memory_slices, start)):
        return None
    return explained(snap, job, name, create_slot(gpu, model, prof, start), why)


def _gang(snap: ClusterSnapshot, job: JobRequest, nodes: Nodes, name: str) -> Decision:
    """The node whose first ``n`` empty GPUs (by position), each taken whole, raise its fragmentation least;
    ties to the node whose first empty GPU comes first."""
    n = job.demand.gpus
    empty = np.flatnonzero(snap.ok & (np.asarray(snap.busy) == 0))
    at = nodes.node[empty]
    order = np.argsort(at, kind="stable")  # by node, each node's GPUs in position order
    empty, at = empty[order], at[order]
    first = np.flatnonzero(np.r_[True, at[1:] != at[:-1]]) if len(at) else np.zeros(0, dtype=np.intp)
    size = np.diff(np.r_[first, len(at)])
    rank = np.arange(len(at)) - np.repeat(first, size)
    candidates = first[size >= n]
    if not len(candidates):
        most = int(size.max()) if len(size) else 0
        return cannot_place(job, name, {no_node_has(n, "empty", most, mig=True): len(snap)})
    taken = rank < n
    members, where = empty[taken], at[taken]
    m, q = len(nodes.total), len(nodes.target.pods)
    dh, dl, dt = np.zeros((m, q), dtype=np.int64), np.zeros((m, q), dtype=np.int64), np.zeros(m, dtype=np.int64)
    for model_name, pos in snap.groups.items():
        model = snap.models[model_name]
        mine = np.isin(members, pos)
        if not mine.any():
            continue
        hosts, full = nodes.target.hosts(model), full_profile(model)
        h0, h1 = hosts[0].astype(np.int64), hosts[span(full.memory_slices, 0)].astype(np.int64)
        f0 = nodes.free[members[mine]]
        f1 = f0 - full.compute_slices
        np.add.at(dh, where[mine], h1 - h0)
        np.add.at(dl, where[mine], np.where(h1, 0, f1[:, None]) - np.where(h0, 0, f0[:, None]))
        np.add.at(dt, where[mine], f1 - f0)
    heads = at[candidates]
    delta = nodes.score(nodes.hosting[heads] + dh[heads], nodes.lacking[heads] + dl[heads],
                        nodes.total[heads] + dt[heads]) - nodes.frag[heads]
    best = int(np.lexsort((empty[candidates], delta))[0])
    head = int(candidates[best])
    gpus = [snap.gpus[int(p)] for p in empty[head:head + n]]
    slots = tuple(full_slot(g, snap.geometry.model(g.model)) for g in gpus)
    return whole_placement(job, slots, name)


@register(PolicySpec(name="fgd", description="FGD (Weng et al., ATC'23): least increase of the node's "
                     "fragmentation against the target workload's typical pods, multi-GPU pods included"),
          accepts=("pods",))
def _build(spec: PolicySpec, params: dict[str, Any]) -> tuple[PolicySpec, Rules]:
    return spec, fgd_rules(spec.name, params.get("pods") or UNIFORM_SHAPES)
