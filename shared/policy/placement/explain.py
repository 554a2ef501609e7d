"""The balancer's ``Placement`` for a chosen candidate: its slot, tier, FragCost before and after, reasons and
runners-up, all read back from the packed keys of ``balancer.place_mig``.

Split out of ``balancer.py`` so that a caller that found the choice another way (the ``PlacementIndex``'s
per-signature keys) builds the very same ``Placement``: these functions take the GPUs in position order and the
models by name, not a snapshot. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shared.mig.geometry import GpuModel, Profile
from shared.mig.tables import COST_SCALE, tables_for
from shared.policy.gpu_view import GpuView, InstanceView
from shared.policy.placement.decision import Candidate, JobRequest, Placement, Slot, Tier
from shared.policy.placement.slots import create_slot

Cand = tuple[int, int, str, Profile, str]
"""One candidate of ``place_mig``: (packed key, GPU position, model name, profile asked for, action)."""


def unpack_cost(key: int, before_q: int = 0) -> float:
    """FragCost after the placement; ``before_q`` is added back when the key holds the increase."""
    return (((key >> 22) & ((1 << 31) - 1)) + before_q) / COST_SCALE


def idle_at(gpu: GpuView, start: int) -> InstanceView:
    return next(i for i in gpu.instances if not i.busy and i.start == start)


def slot_for(
    gpus: Sequence[GpuView], models: Mapping[str, GpuModel], cand: Cand,
    reuse_insts: Mapping[int, InstanceView] | None = None,
) -> Slot:
    """The slot of a candidate; a reuse one takes ``reuse_insts``'s instance, by default the idle one at the
    start its key holds."""
    key, p, model_name, prof, action = cand
    gpu = gpus[p]
    model = models[model_name]
    if action == "reuse":
        inst = reuse_insts[p] if reuse_insts is not None else idle_at(gpu, 15 - (key & 0xF))
        return Slot(
            gpu_id=gpu.id, node=gpu.node, model=model.name, profile=inst.profile, start=inst.start,
            size=inst.size, compute=inst.compute, action="reuse", instance_id=inst.id,
        )
    return create_slot(gpu, model, prof, 15 - (key & 0xF))


def tier_name(key: int, lazy_first: bool) -> Tier:
    if not lazy_first:
        return "any"
    return "lazy" if (key >> 54) == 0 else "busy"


def explain_choice(
    gpus: Sequence[GpuView], models: Mapping[str, GpuModel], job: JobRequest, threshold: float,
    lazy_first: bool, delta: bool, top_k: int, policy: str, chosen: Cand, ranked: Sequence[Cand],
    reuse_insts: Mapping[int, InstanceView] | None = None,
) -> Placement:
    """The ``Placement`` of ``chosen``, with the first ``top_k`` of ``ranked`` (chosen first) as candidates.
    ``reuse_insts``: the idle instance each reuse candidate takes (default: the one at its key's start)."""
    slot = slot_for(gpus, models, chosen, reuse_insts)
    gpu = gpus[chosen[1]]
    model = models[chosen[2]]
    tables = tables_for(model)
    before = tables.cost(gpu.busy_mask)
    after = unpack_cost(chosen[0], int(tables.fragcost_q[gpu.busy_mask]) if delta else 0)
    tier = tier_name(chosen[0], lazy_first)
    load = gpu.used_compute / model.compute_slices
    reasons = [
        (f"{tier} tier (load {load:.2f} vs threshold {threshold})" if tier != "any"
         else f"load {load:.2f}"),
        ("reuses idle instance " + str(slot.instance_id) if slot.action == "reuse"
         else "creates a new instance"),
        (f"least FragCost increase: {before:.3f} -> {after:.3f}" if delta
         else f"lowest FragCost after: {after:.3f}"),
    ]
    if slot.destroy:
        reasons.append(f"destroys {len(slot.destroy)} idle instance(s) in the way")
    cands = []
    for cand in ranked[:top_k]:
        key, p, model_name, prof, action = cand
        g = gpus[p]
        # a runner-up's slot is not needed, only its profile and start (a reuse may take a larger profile)
        start = 15 - (key & 0xF)
        if cand is chosen:
            profile = slot.profile
        elif action == "reuse":
            profile = (reuse_insts[p] if reuse_insts is not None else idle_at(g, start)).profile
        else:
            profile = prof.name
        m = model if model_name == model.name else models[model_name]
        t = tables if m is model else tables_for(m)
        cands.append(
            Candidate(
                gpu_id=g.id, profile=profile, start=start, action="reuse" if action == "reuse" else "create",
                tier=tier_name(key, lazy_first),
                frag_before=t.cost(g.busy_mask),
                frag_after=unpack_cost(key, int(t.fragcost_q[g.busy_mask]) if delta else 0),
                load=g.used_compute / m.compute_slices,
                idle_slices_destroyed=(key >> 15) & 0xF,
            )
        )
    return Placement(
        job_id=job.job_id, policy=policy, slots=(slot,), tier=tier, frag_before=before, frag_after=after,
        reasons=tuple(reasons), candidates=tuple(cands),
    )


def whole_placement(job: JobRequest, slots: tuple[Slot, ...], policy: str = "balancer") -> Placement:
    """``balancer.place_whole``'s answer for the ``slots`` it chose (all on one node)."""
    n = job.demand.gpus
    return Placement(
        job_id=job.job_id, policy=policy, slots=slots, tier="any", frag_before=0.0, frag_after=1.0,
        reasons=(f"{n} whole GPU(s) on node {slots[0].node}, the tightest node that fits",),
    )
