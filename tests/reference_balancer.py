"""The balancer as a straightforward per-GPU Python loop: the reference for ``balancer.place_mig``.

Same candidates, same keys, same tie-breaks (see ``balancer``'s docstring), written the obvious way: one
GPU at a time, one placement at a time, looking FragCost up in the same per-model tables. A property test
holds the two to identical choices, and ``load/bench_placement.py`` measures the vectorised version against
this one.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Container

from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span
from shared.mig.tables import tables_for
from shared.policy.placement.balancer import BalancerParams, _count_ok, _decision
from shared.policy.placement.balancer_keys import _acceptable
from shared.policy.placement.decision import CannotPlace, Decision, JobRequest
from shared.policy.request import resolve_profile
from shared.policy.snapshot import ClusterSnapshot, InstanceView


def _pack(tier: int, action: int, cost_q: int, waste: int, overlap: int, load_q: int, start: int) -> int:
    """``balancer.pack_key`` on plain ints (numpy scalars would dominate a Python loop)."""
    k = ((tier * 2 + action) << 31) + cost_q
    k = (k << 3) + waste
    k = (k << 4) + overlap
    k = (k << 11) + load_q
    return (k << 4) + (15 - start)


_Names = Container[str]
Cand = tuple[int, int, str, Profile, str]
"""(key, snapshot position, model name, profile, action), as the vectorised balancer ranks them."""


def place_mig_loop(
    snap: ClusterSnapshot, job: JobRequest, params: BalancerParams, policy: str = "balancer"
) -> Decision:
    t_q = round(params.threshold * 1000)
    counts: Counter[str] = Counter()
    cands: list[Cand] = []
    reuse_insts: dict[int, InstanceView] = {}
    # per model, once: the profile, its FragCost list, the acceptable idle profiles and the placement masks
    resolved: dict[str, tuple[GpuModel, Profile | None, list[int], _Names, list[tuple[int, int]]]] = {}
    mig, healthy = snap.mig.tolist(), snap.healthy.tolist()
    for pos, gpu in enumerate(snap.gpus):
        if gpu.model not in resolved:
            m = snap.geometry.model(gpu.model)
            p = resolve_profile(job.demand, m)
            t = tables_for(m)
            accept: _Names = _acceptable(t, p, params.allow_larger) if p is not None else {}
            spans = [(s, span(p.memory_slices, s)) for s in p.placements] if p is not None else []
            resolved[gpu.model] = (m, p, t.fragcost_q.tolist(), accept, spans)
        model, prof, fragcost_q, accept, spans = resolved[gpu.model]
        if prof is None:
            counts[f"{model.name} has no profile for {job.demand.label()}"] += 1
            continue
        if not (mig[pos] and healthy[pos]):  # the columns: a policy may hold GPUs through them
            counts["not in MIG mode or unhealthy"] += 1
            continue
        load_q = round(gpu.used_compute * 1000.0 / max(model.compute_slices, 1))
        tier = 1 if params.lazy_first and load_q >= t_q else 0
        before_q = fragcost_q[gpu.busy_mask] if params.rank == "delta" else 0
        best_reuse: tuple[int, InstanceView] | None = None
        for inst in gpu.instances:
            if inst.busy or inst.profile not in accept:
                continue
            cost_q = fragcost_q[gpu.busy_mask | inst.mask] - before_q
            key = _pack(tier, 0, cost_q, inst.size - prof.memory_slices, 0, load_q, inst.start)
            if best_reuse is None or key < best_reuse[0]:
                best_reuse = (key, inst)
        if best_reuse is not None:
            cands.append((best_reuse[0], pos, model.name, prof, "reuse"))
            reuse_insts[pos] = best_reuse[1]
        if not params.dynamic:
            continue
        best_start: tuple[tuple[int, int, int], int] | None = None
        for s, pm in spans:
            if gpu.busy_mask & pm:
                continue
            score = (fragcost_q[gpu.busy_mask | pm], (gpu.idle_mask & pm).bit_count(), -s)
            if best_start is None or score < best_start[0]:
                best_start = (score, s)
        if best_start is None:
            counts[f"no free {prof.name} placement"] += 1
            continue
        (cost_q, ov, _), s = best_start
        if not _count_ok(gpu, prof, s):
            counts[f"{prof.name} at its max count"] += 1
            continue
        cands.append((_pack(tier, 1, cost_q - before_q, 0, ov, load_q, s), pos, model.name, prof, "create"))
    if not cands:
        reasons = tuple(f"{n} GPU(s): {why}" for why, n in counts.most_common()) or ("no GPU in the cluster",)
        return CannotPlace(job_id=job.job_id, policy=policy, reasons=reasons, counts=dict(counts))
    ranked = heapq.nsmallest(max(params.top_k, 1), cands, key=lambda c: (c[0], c[1]))
    return _decision(snap, job, params, policy, ranked[0], ranked, reuse_insts)
