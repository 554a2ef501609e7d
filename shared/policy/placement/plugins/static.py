"""Static partitions: a fixed layout per GPU (``static_layout``), never repartitioned. ``static`` gives a job
the smallest idle instance that covers it; ``lb-static`` is the conditional load balancer restricted to the
layout (load balancing only). Both take ``layout`` (``all-balanced``, ``all-<shape>`` or ``all-<profile>``),
and ``lb-static`` the balancer's keys.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from shared.mig.geometry import GpuModel, Profile
from shared.mig.tables import tables_for
from shared.policy.placement.balancer import BalancerParams, place_mig
from shared.policy.placement.decision import CannotPlace, Decision, JobRequest, Placement
from shared.policy.placement.registry import PolicySpec, Rules, register
from shared.policy.placement.slots import (
    cannot_place,
    column,
    explained,
    idle_instance,
    model_groups,
    reuse_slot,
)
from shared.policy.request import full_profile
from shared.policy.snapshot import ClusterSnapshot, GpuView
from shared.policy.static_layouts import LayoutError


def _covering(model: GpuModel, prof: Profile) -> list[Profile]:
    """Profiles whose instance can host a job sized for ``prof``, smallest first."""
    out = [
        p for p in model.profiles
        if p.compute_slices >= prof.compute_slices and p.memory_slices >= prof.memory_slices
        and p.memory_gib + 1e-9 >= prof.memory_gib and p.media_extensions == prof.media_extensions
    ]
    return sorted(out, key=lambda p: (p.memory_slices, p.compute_slices, p.memory_gib, p.name))


def _static_whole(snap: ClusterSnapshot, job: JobRequest) -> Decision:
    """``gpus: n`` under a static layout: n GPUs of one node laid out as one idle full-size instance."""
    n = job.demand.gpus
    by_node: dict[str, list[tuple[GpuView, str]]] = {}
    for p, gpu in enumerate(snap.gpus):
        if not (snap.mig[p] and snap.healthy[p]) or gpu.busy_mask or len(gpu.instances) != 1:
            continue
        model = snap.geometry.model(gpu.model)
        inst = gpu.instances[0]
        if inst.profile == full_profile(model).name:
            by_node.setdefault(gpu.node, []).append((gpu, inst.id))
    fitting = sorted((len(v), node) for node, v in by_node.items() if len(v) >= n)
    if not fitting:
        return CannotPlace(job_id=job.job_id, policy="static", reasons=(
            f"no node has {n} GPU(s) laid out as one idle full-size instance (static layout)",))
    node = fitting[0][1]
    chosen = sorted(by_node[node], key=lambda gi: gi[0].index)[:n]
    slots = tuple(reuse_slot(g, snap.geometry.model(g.model), iid) for g, iid in chosen)
    return Placement(job_id=job.job_id, policy="static", slots=slots, tier="any", frag_before=0.0, frag_after=1.0,
                     reasons=(f"{n} whole GPU(s) on node {node}, static full-size instances",))


def static_rules(name: str) -> Rules:
    def mig(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        counts: dict[str, int] = {}
        best: tuple[tuple[int, int, int], GpuModel, Profile] | None = None
        for model, prof, pos, ok in model_groups(snap, job, counts):
            index = tables_for(model).index
            idle_bits = column(snap.idle_profiles)[pos]
            for cover in _covering(model, prof):
                hit = np.flatnonzero(ok & ((idle_bits & np.uint32(1 << index[cover.name])) != 0))
                if hit.size:
                    key = (cover.memory_slices, cover.compute_slices, int(pos[hit[0]]))
                    if best is None or key < best[0]:
                        best = (key, model, cover)
                    break
            else:
                counts[f"no idle instance covering {prof.name}"] = int(ok.sum())
        if best is None:
            return cannot_place(job, name, counts)
        (_, _, p), model, cover = best
        gpu = snap.gpus[p]
        inst_id = idle_instance(gpu, cover, highest=False)
        assert inst_id is not None
        return explained(snap, job, name, reuse_slot(gpu, model, inst_id),
                          f"{name}: smallest idle instance that covers the job ({cover.name})")

    return Rules(mig=mig, gang=_static_whole, plain_first=False)


def lb_static_rules(params: BalancerParams) -> Rules:
    def mig(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        return place_mig(snap, job, params)

    return Rules(mig=mig, gang=_static_whole, plain_first=False)


_BALANCER_KEYS = ("threshold", "lazy_first", "top_k", "rank")


def _layout(spec: PolicySpec, params: dict[str, Any]) -> PolicySpec:
    layout = str(params.get("layout", "all-balanced"))
    if not layout.startswith("all-"):
        raise LayoutError(f"unknown layout {layout!r}: use all-balanced, all-<shape> or all-<profile>")
    return msgspec.structs.replace(spec, initial_layout=layout)


@register(PolicySpec(name="static", description="fixed layout per GPU, never repartitioned; smallest idle "
                     "instance that covers the job", repartitions=False), accepts=("layout",))
def _build_static(spec: PolicySpec, params: dict[str, Any]) -> tuple[PolicySpec, Rules]:
    return _layout(spec, params), static_rules(spec.name)


@register(PolicySpec(name="lb-static", description="conditional load balancer over a static layout (load "
                     "balancing only)", repartitions=False, takes_threshold=True),
          accepts=("layout", *_BALANCER_KEYS))
def _build_lb_static(spec: PolicySpec, params: dict[str, Any]) -> tuple[PolicySpec, Rules]:
    bal = {k: params[k] for k in _BALANCER_KEYS if k in params}
    return _layout(spec, params), lb_static_rules(BalancerParams(dynamic=False, allow_larger=True, **bal))
