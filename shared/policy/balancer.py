"""The conditional load balancer (the seeds' algorithm), vectorised over the snapshot's columns.

Order of preference for a MIG request, over every GPU that is healthy, in MIG mode and has a fitting profile:

1. tier: Lazy GPUs (load < threshold) before Busy ones; a Busy GPU is used only when no Lazy GPU fits;
2. action: reuse an idle instance of the exact profile before creating one;
3. lowest FragCost after the placement (busy instances only: idle ones are reclaimable);
4. fewest idle memory slices destroyed (each destroyed instance is a reconfiguration);
5. lower load, then the higher start index (NVIDIA's habit, keeps low slices for big profiles);
6. the GPU listed first in the snapshot.

All six keys are packed into one int64 per GPU so that the choice is one argmin.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import msgspec
import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel, Profile
from shared.mig.tables import COST_SCALE, ModelTables, tables_for
from shared.policy.placement import Candidate, CannotPlace, Decision, JobRequest, Placement, Slot, Tier
from shared.policy.request import full_profile, resolve_profile
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView

_NONE = np.iinfo(np.int64).max


class BalancerParams(msgspec.Struct, frozen=True, kw_only=True):
    threshold: float = 0.4
    lazy_first: bool = True
    dynamic: bool = True
    """Create instances on demand. False = static partitions: only existing idle instances are used."""
    allow_larger: bool = False
    """Reuse an idle instance of a larger profile (internal fragmentation); static layouts need it."""
    top_k: int = 3


def pack_key(
    tier: npt.NDArray[np.int64] | int,
    action: int,
    cost_q: npt.NDArray[np.int64] | int,
    waste: npt.NDArray[np.int64] | int,
    overlap: npt.NDArray[np.int64] | int,
    load_q: npt.NDArray[np.int64] | int,
    start: npt.NDArray[np.int64] | int,
) -> npt.NDArray[np.int64]:
    """One comparable integer per candidate: lower is better (see the module docstring)."""
    k = np.asarray(tier, dtype=np.int64) * 2 + action
    k = (k << 31) + cost_q
    k = (k << 3) + waste
    k = (k << 4) + overlap
    k = (k << 11) + load_q
    return (k << 4) + (15 - np.asarray(start, dtype=np.int64))


def _unpack_cost(key: int) -> float:
    return ((key >> 22) & ((1 << 31) - 1)) / COST_SCALE


def _load_q(snap: ClusterSnapshot, pos: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
    return np.rint(snap.used[pos] * 1000.0 / np.maximum(snap.compute[pos], 1)).astype(np.int64)


class _Best:
    """The running best candidate over model groups, plus the top-k for explanation."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.keys: list[npt.NDArray[np.int64]] = []
        self.pos: list[npt.NDArray[np.intp]] = []
        self.meta: list[tuple[str, Profile, str]] = []  # model, profile, action

    def add(self, keys: npt.NDArray[np.int64], pos: npt.NDArray[np.intp], model: str, prof: Profile, action: str) -> None:
        if keys.size:
            self.keys.append(keys)
            self.pos.append(pos)
            self.meta.append((model, prof, action))

    def ranked(self) -> list[tuple[int, int, str, Profile, str]]:
        out: list[tuple[int, int, str, Profile, str]] = []
        for keys, pos, (model, prof, action) in zip(self.keys, self.pos, self.meta, strict=True):
            take = min(self.k + 8, keys.size)
            idx = np.argpartition(keys, take - 1)[:take] if take < keys.size else np.arange(keys.size)
            out.extend((int(keys[i]), int(pos[i]), model, prof, action) for i in idx if keys[i] != _NONE)
        out.sort(key=lambda r: (r[0], r[1]))
        return out


def _tier(lazy: npt.NDArray[np.bool_], params: BalancerParams) -> npt.NDArray[np.int64]:
    if not params.lazy_first:
        return np.zeros(lazy.shape, dtype=np.int64)
    return np.where(lazy, 0, 1).astype(np.int64)


def _reuse_keys(
    snap: ClusterSnapshot, pos: npt.NDArray[np.intp], tables: ModelTables, wanted: Profile,
    tier: npt.NDArray[np.int64], load_q: npt.NDArray[np.int64], params: BalancerParams,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.intp], list[InstanceView]]:
    """Keys for the best idle instance on each GPU that has one the job can use."""
    accept = _acceptable(tables, wanted, params)
    bits = 0
    for name in accept:
        bits |= 1 << tables.index[name]
    has = (snap.idle_profiles[pos] & np.uint32(bits)) != 0
    keys: list[int] = []
    where: list[int] = []
    insts: list[InstanceView] = []
    for j in np.flatnonzero(has):
        gpu = snap.gpus[pos[j]]
        best: tuple[int, InstanceView] | None = None
        for inst in gpu.instances:
            if inst.busy or inst.profile not in accept:
                continue
            waste = inst.size - wanted.memory_slices
            cost_q = int(tables.fragcost_q[gpu.busy_mask | inst.mask])
            key = int(pack_key(int(tier[j]), 0, cost_q, waste, 0, int(load_q[j]), inst.start))
            if best is None or key < best[0]:
                best = (key, inst)
        if best is not None:
            keys.append(best[0])
            where.append(int(pos[j]))
            insts.append(best[1])
    return np.asarray(keys, dtype=np.int64), np.asarray(where, dtype=np.intp), insts


def _acceptable(tables: ModelTables, wanted: Profile, params: BalancerParams) -> dict[str, Profile]:
    if not params.allow_larger:
        return {wanted.name: wanted}
    return {
        p.name: p
        for p in tables.profiles
        if p.compute_slices >= wanted.compute_slices
        and p.memory_slices >= wanted.memory_slices
        and p.media_extensions == wanted.media_extensions
    }


def _count_ok(gpu: GpuView, prof: Profile) -> bool:
    return sum(1 for i in gpu.instances if i.profile == prof.name) < prof.max_count


def place_mig(snap: ClusterSnapshot, job: JobRequest, params: BalancerParams, policy: str = "balancer") -> Decision:
    counts: Counter[str] = Counter()
    best = _Best(params.top_k)
    reuse_insts: dict[int, InstanceView] = {}
    for model_name, pos in snap.groups.items():
        model = snap.models[model_name]
        prof = resolve_profile(job.demand, model)
        if prof is None:
            counts[f"{model_name} has no profile for {job.demand.label()}"] += pos.size
            continue
        ok = snap.mig[pos] & snap.healthy[pos]
        if not ok.all():
            counts["not in MIG mode or unhealthy"] += int((~ok).sum())
            pos = pos[ok]
        if pos.size == 0:
            continue
        tables = tables_for(model)
        load_q = _load_q(snap, pos)
        tier = _tier(load_q < round(params.threshold * 1000), params)
        rkeys, rpos, rinsts = _reuse_keys(snap, pos, tables, prof, tier, load_q, params)
        best.add(rkeys, rpos, model_name, prof, "reuse")
        for p_, inst in zip(rpos, rinsts, strict=True):
            reuse_insts[int(p_)] = inst
        if params.dynamic:
            start_t, cost_t, ov_t = tables.best_create(prof.name)
            pair = (snap.busy[pos].astype(np.intp) << 8) | snap.idle[pos]
            start = start_t[pair].astype(np.int64)
            fits = start >= 0
            counts[f"no free {prof.name} placement"] += int((~fits).sum())
            keys = pack_key(tier, 1, cost_t[pair], 0, ov_t[pair], load_q, start)
            keys = np.where(fits, keys, _NONE)
            best.add(keys[fits], pos[fits], model_name, prof, "create")
    ranked = best.ranked()
    chosen: tuple[int, int, str, Profile, str] | None = None
    for cand in ranked:
        gpu = snap.gpus[cand[1]]
        if cand[4] == "create" and not _count_ok(gpu, cand[3]):
            counts[f"{cand[3].name} at its max count"] += 1
            continue
        chosen = cand
        break
    if chosen is None:
        reasons = tuple(f"{n} GPU(s): {why}" for why, n in counts.most_common()) or ("no GPU in the cluster",)
        return CannotPlace(job_id=job.job_id, policy=policy, reasons=reasons, counts=dict(counts))
    return _decision(snap, job, params, policy, chosen, ranked, reuse_insts)


def _create_slot(gpu: GpuView, model: GpuModel, prof: Profile, start: int) -> Slot:
    pm = ((1 << prof.memory_slices) - 1) << start
    destroy = tuple(i.id for i in gpu.instances if not i.busy and i.mask & pm)
    return Slot(
        gpu_id=gpu.id, node=gpu.node, model=model.name, profile=prof.name, start=start,
        size=prof.memory_slices, compute=prof.compute_slices, action="create", destroy=destroy,
    )


def _slot_for(
    snap: ClusterSnapshot, cand: tuple[int, int, str, Profile, str], reuse_insts: dict[int, InstanceView]
) -> Slot:
    key, p, model_name, prof, action = cand
    gpu = snap.gpus[p]
    model = snap.models[model_name]
    if action == "reuse":
        inst = reuse_insts[p]
        return Slot(
            gpu_id=gpu.id, node=gpu.node, model=model.name, profile=inst.profile, start=inst.start,
            size=inst.size, compute=inst.compute, action="reuse", instance_id=inst.id,
        )
    return _create_slot(gpu, model, prof, 15 - (key & 0xF))


def _tier_name(key: int, params: BalancerParams) -> Tier:
    if not params.lazy_first:
        return "any"
    return "lazy" if (key >> 54) == 0 else "busy"


def _decision(
    snap: ClusterSnapshot, job: JobRequest, params: BalancerParams, policy: str,
    chosen: tuple[int, int, str, Profile, str], ranked: Sequence[tuple[int, int, str, Profile, str]],
    reuse_insts: dict[int, InstanceView],
) -> Placement:
    slot = _slot_for(snap, chosen, reuse_insts)
    gpu = snap.gpus[chosen[1]]
    tables = tables_for(snap.models[chosen[2]])
    before = tables.cost(gpu.busy_mask)
    after = _unpack_cost(chosen[0])
    tier = _tier_name(chosen[0], params)
    load = gpu.used_compute / snap.models[chosen[2]].compute_slices
    reasons = [
        f"{tier} tier (load {load:.2f} vs threshold {params.threshold})" if tier != "any" else f"load {load:.2f}",
        "reuses idle instance " + str(slot.instance_id) if slot.action == "reuse" else "creates a new instance",
        f"lowest FragCost after: {after:.3f}",
    ]
    if slot.destroy:
        reasons.append(f"destroys {len(slot.destroy)} idle instance(s) in the way")
    cands = []
    for key, p, model_name, prof, _action in ranked[: params.top_k]:
        s = _slot_for(snap, (key, p, model_name, prof, _action), reuse_insts)
        g = snap.gpus[p]
        t = tables_for(snap.models[model_name])
        cands.append(
            Candidate(
                gpu_id=g.id, profile=s.profile, start=s.start, action=s.action, tier=_tier_name(key, params),
                frag_before=t.cost(g.busy_mask), frag_after=_unpack_cost(key),
                load=g.used_compute / snap.models[model_name].compute_slices,
                idle_slices_destroyed=int((key >> 15) & 0xF),
            )
        )
    return Placement(
        job_id=job.job_id, policy=policy, slots=(slot,), tier=tier, frag_before=before, frag_after=after,
        reasons=tuple(reasons), candidates=tuple(cands),
    )


def place_whole(snap: ClusterSnapshot, job: JobRequest, params: BalancerParams, policy: str = "balancer") -> Decision:
    """``gpus: n`` on one node, all or nothing: n empty MIG GPUs, each given its full-size instance.

    The node chosen is the one with the fewest empty GPUs that still has n (best fit keeps whole nodes free for
    bigger gangs); on it, GPUs holding an idle full-size instance first, then those with the least to destroy.
    """
    n = job.demand.gpus
    by_node: dict[str, list[GpuView]] = {}
    counts: Counter[str] = Counter()
    empty = np.flatnonzero((snap.busy == 0) & snap.mig & snap.healthy)
    for p in empty:
        g = snap.gpus[p]
        by_node.setdefault(g.node, []).append(g)
    counts["not empty, not MIG or unhealthy"] = len(snap) - int(empty.size)
    fitting = [(len(gs), node) for node, gs in by_node.items() if len(gs) >= n]
    if not fitting:
        most = max((len(v) for v in by_node.values()), default=0)
        return CannotPlace(
            job_id=job.job_id, policy=policy,
            reasons=(f"no node has {n} empty GPU(s); the most on one node is {most}",), counts=dict(counts),
        )
    _, node = min(fitting)
    slots: list[Slot] = []

    def order(g: GpuView) -> tuple[int, int, int]:
        full = full_profile(snap.geometry.model(g.model))
        has_full = any(i.profile == full.name for i in g.instances)
        return (0 if has_full else 1, g.idle_mask.bit_count(), g.index)

    for g in sorted(by_node[node], key=order)[:n]:
        model = snap.geometry.model(g.model)
        full = full_profile(model)
        idle_full = next((i for i in g.instances if i.profile == full.name), None)
        if idle_full is not None:
            slots.append(Slot(gpu_id=g.id, node=g.node, model=model.name, profile=full.name, start=0,
                              size=full.memory_slices, compute=full.compute_slices, action="reuse",
                              instance_id=idle_full.id))
        else:
            slots.append(_create_slot(g, model, full, full.placements[0]))
    return Placement(
        job_id=job.job_id, policy=policy, slots=tuple(slots), tier="any", frag_before=0.0, frag_after=1.0,
        reasons=(f"{n} whole GPU(s) on node {node}, the tightest node that fits",),
    )


def place(snap: ClusterSnapshot, job: JobRequest, params: BalancerParams | None = None) -> Decision:
    """The migsched balancer: one decision for one job over one snapshot."""
    params = params or BalancerParams()
    if job.demand.kind == "gpus":
        return place_whole(snap, job, params)
    if job.demand.kind == "shared":
        return CannotPlace(job_id=job.job_id, policy="balancer",
                           reasons=("time-sliced shares need a GPU configured with replicas; none here",))
    return place_mig(snap, job, params)
