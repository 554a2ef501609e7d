"""What a job is charged against its tenant's quota: from its demand, its placement, or a running instance.

A MIG instance charges one ``nvidia.com/mig-<profile>`` plus its compute slices and GiB; a whole GPU charges
one ``nvidia.com/gpu`` plus its model's compute slices and GiB; a time-sliced share charges one
``nvidia.com/gpu.shared`` plus 1/replicas of its GPU (nominal only: nothing enforces it, no memory isolation).
Before placement the model is unknown, so ``request_usages`` gives one option per model that could host the
job (``quota.admit_any``); after placement ``placement_usage`` is exact: admit it, charge it, store it with
the job, and uncharge exactly it when the job ends or is preempted.
"""

from __future__ import annotations

import msgspec
import numpy as np

from shared.mig.geometry import GpuModel, Profile
from shared.policy.placement.decision import Placement
from shared.policy.placement.sharing import SHARE_PROFILE, WHOLE_PROFILE
from shared.policy.request import Demand, resolve_profile
from shared.policy.resources import COMPUTE, EMPTY, GPU, MEMORY, MIG_PREFIX, SHARED, Usage
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView


def profile_usage(profile: Profile) -> Usage:
    return Usage({MIG_PREFIX + profile.name: 1, COMPUTE: profile.compute_slices, MEMORY: profile.memory_gib})


def whole_gpu_usage(model: GpuModel, n: int = 1) -> Usage:
    return Usage({GPU: n, COMPUTE: n * model.compute_slices, MEMORY: n * model.memory_gib})


def share_usage(model: GpuModel, replicas: int) -> Usage:
    """One time-sliced share: nominally 1/replicas of the GPU (nothing enforces it: no memory isolation)."""
    r = max(replicas, 1)
    return Usage({SHARED: 1, COMPUTE: model.compute_slices / r, MEMORY: model.memory_gib / r})


def request_usages(snap: ClusterSnapshot, demand: Demand) -> tuple[Usage, ...]:
    """The distinct charges ``demand`` may get on this cluster, one per GPU model (and replica count for
    shares) that could host it; empty when nothing could."""
    out: dict[Usage, None] = {}
    if demand.kind == "mig":
        for name in snap.groups:
            prof = resolve_profile(demand, snap.models[name])
            if prof is not None:
                out[profile_usage(prof)] = None
    elif demand.kind == "gpus":
        for name in snap.groups:
            out[whole_gpu_usage(snap.models[name], demand.gpus)] = None
    else:
        seen: set[tuple[str, int]] = set()
        for p in np.flatnonzero(~np.asarray(snap.mig, dtype=bool)):
            g = snap.gpus[p]
            if g.replicas >= 1 and (g.model, g.replicas) not in seen:
                seen.add((g.model, g.replicas))
                out[share_usage(snap.models[snap.geometry.model(g.model).name], g.replicas)] = None
    return tuple(out)


def placement_usage(snap: ClusterSnapshot, placement: Placement, demand: Demand) -> Usage:
    """The exact charge of a placement: what to ``admit`` before commit, ``charge`` on commit, store with the
    job and ``uncharge`` when it ends or is preempted."""
    total = EMPTY
    for slot in placement.slots:
        model = snap.geometry.model(slot.model)
        if demand.kind == "gpus":
            total = total + whole_gpu_usage(model, 1)
        elif demand.kind == "shared":
            total = total + share_usage(model, snap.gpu(slot.gpu_id).replicas)
        else:
            total = total + profile_usage(model.profile(slot.profile))
    return total


def slot_usages(snap: ClusterSnapshot, placement: Placement, demand: Demand) -> tuple[Usage, ...]:
    """``placement_usage`` split by slot (they sum to it): a gang's charge per GPU, so that re-deriving one
    GPU's charges from its instances (``instance_usage``) agrees with what was booked for it."""
    return tuple(
        placement_usage(snap, msgspec.structs.replace(placement, slots=(slot,)), demand) for slot in placement.slots
    )


def instance_usage(gpu: GpuView, model: GpuModel, inst: InstanceView) -> Usage:
    """What a running instance is charged, as far as the snapshot tells (a whole-GPU job on a MIG GPU shows as
    its full-size profile; compute and memory are the same either way)."""
    if inst.profile == WHOLE_PROFILE:
        return whole_gpu_usage(model, 1)
    if inst.profile == SHARE_PROFILE:
        return share_usage(model, gpu.replicas)
    if model.has_profile(inst.profile):
        return profile_usage(model.profile(inst.profile))
    return EMPTY


def capacity_of(snap: ClusterSnapshot) -> Usage:
    """Compute slices and GiB of the healthy GPUs: the fair-share denominators of tenants without a quota."""
    compute = memory = 0.0
    for name, pos in snap.groups.items():
        n = int(snap.healthy[pos].sum())
        compute += n * snap.models[name].compute_slices
        memory += n * snap.models[name].memory_gib
    return Usage({COMPUTE: compute, MEMORY: memory})
