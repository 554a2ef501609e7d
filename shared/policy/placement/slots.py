"""What the baseline placement policies share: slot construction, legality checks, explained decisions.

Shared by the policy plug-ins (``shared.policy.placement.plugins``): the greedy baselines, FGD, the static layouts and
``migsched``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.errors import MigschedError
from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span
from shared.mig.tables import PAIRS, tables_for
from shared.policy.placement.decision import CannotPlace, Decision, JobRequest, Placement, Slot
from shared.policy.request import full_profile, resolve_profile
from shared.policy.snapshot import ClusterSnapshot, GpuView

PlacementPolicy = Callable[[ClusterSnapshot, JobRequest], Decision]


class UnknownPolicyError(MigschedError, KeyError):
    """No policy of that name, or a parameter the policy does not take."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown policy"


def column(column: Any) -> npt.NDArray[Any]:
    return np.asarray(column)


def usable(snap: ClusterSnapshot, pos: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_]:
    return np.asarray(snap.mig[pos], dtype=bool) & np.asarray(snap.healthy[pos], dtype=bool)


def model_groups(
    snap: ClusterSnapshot, job: JobRequest, counts: dict[str, int]
) -> Iterator[tuple[GpuModel, Profile, npt.NDArray[np.intp], npt.NDArray[np.bool_]]]:
    """Per GPU model of the snapshot with a profile for the job: (model, profile, positions, usable there),
    counting in ``counts`` the GPUs ruled out by model or by mode and health."""
    for model_name, pos in snap.groups.items():
        model = snap.models[model_name]
        prof = resolve_profile(job.demand, model)
        if prof is None:
            counts[f"{model_name} has no profile for {job.demand.label()}"] = pos.size
            continue
        ok = usable(snap, pos)
        counts["not in MIG mode or unhealthy"] = counts.get("not in MIG mode or unhealthy", 0) + int((~ok).sum())
        yield model, prof, pos, ok


def count_ok(gpu: GpuView, prof: Profile, pm: int) -> bool:
    """Room for one more ``prof`` once the idle instances under ``pm`` are destroyed (partition's rule)."""
    n = sum(1 for i in gpu.instances if i.profile == prof.name and not (not i.busy and i.mask & pm))
    return n < prof.max_count


def create_slot(gpu: GpuView, model: GpuModel, prof: Profile, start: int) -> Slot:
    pm = span(prof.memory_slices, start)
    return Slot(
        gpu_id=gpu.id, node=gpu.node, model=model.name, profile=prof.name, start=start,
        size=prof.memory_slices, compute=prof.compute_slices, action="create",
        destroy=tuple(i.id for i in gpu.instances if not i.busy and i.mask & pm),
    )


def reuse_slot(gpu: GpuView, model: GpuModel, inst_id: str) -> Slot:
    inst = gpu.instance(inst_id)
    assert inst is not None
    return Slot(
        gpu_id=gpu.id, node=gpu.node, model=model.name, profile=inst.profile, start=inst.start,
        size=inst.size, compute=inst.compute, action="reuse", instance_id=inst.id,
    )


def explained(snap: ClusterSnapshot, job: JobRequest, policy: str, slot: Slot, why: str) -> Placement:
    gpu = snap.gpu(slot.gpu_id)
    tables = tables_for(snap.geometry.model(gpu.model))
    after = gpu.busy_mask | span(slot.size, slot.start)
    action = f"reuses idle instance {slot.instance_id}" if slot.action == "reuse" else "creates an instance"
    reasons = [why, action]
    if slot.destroy:
        reasons.append(f"destroys {len(slot.destroy)} idle instance(s) in the way")
    return Placement(
        job_id=job.job_id, policy=policy, slots=(slot,), tier="any", frag_before=tables.cost(gpu.busy_mask),
        frag_after=tables.cost(after), reasons=tuple(reasons),
    )


def cannot_place(job: JobRequest, policy: str, counts: Mapping[str, int]) -> CannotPlace:
    reasons = tuple(f"{n} GPU(s): {why}" for why, n in sorted(counts.items(), key=lambda kv: -kv[1]) if n)
    return CannotPlace(job_id=job.job_id, policy=policy, reasons=reasons or ("no GPU in the cluster",),
                       counts={k: v for k, v in counts.items() if v})


@functools.cache
def start_table(model: GpuModel, profile: str, highest: bool) -> npt.NDArray[np.int8]:
    """Per ``busy << 8 | idle``: the lowest (or highest) start free of busy slices, preferring one that
    overlaps no idle instance; -1 when none."""
    prof = model.profile(profile)
    pairs = np.arange(PAIRS, dtype=np.int64)
    busy, idle = pairs >> 8, pairs & 0xFF
    clean = np.full(PAIRS, -1, dtype=np.int8)
    dirty = np.full(PAIRS, -1, dtype=np.int8)
    for s in sorted(prof.placements, reverse=not highest):  # later writes win: the preferred end is last
        pm = span(prof.memory_slices, s)
        free = (busy & pm) == 0
        dirty[free] = s
        clean[free & ((idle & pm) == 0)] = s
    out = np.where(clean >= 0, clean, dirty).astype(np.int8)
    out.setflags(write=False)
    return out


def idle_instance(gpu: GpuView, prof: Profile, highest: bool) -> str | None:
    starts = [(i.start, i.id) for i in gpu.instances if not i.busy and i.profile == prof.name]
    if not starts:
        return None
    return (max(starts) if highest else min(starts))[1]


def whole_order(g: GpuView, model: GpuModel) -> tuple[int, int, int]:
    """A whole-GPU gang's preference among a node's empty GPUs: an idle full-size instance first (no
    reconfiguration), then the fewest idle slices (the fewest destroyed), then the lower index."""
    full = full_profile(model)
    has_full = any(i.profile == full.name for i in g.instances)
    return (0 if has_full else 1, g.idle_mask.bit_count(), g.index)


def full_slot(g: GpuView, model: GpuModel) -> Slot:
    """The full-size instance of an empty GPU for a gang member: its idle one, else one created."""
    full = full_profile(model)
    idle_full = next((i for i in g.instances if i.profile == full.name), None)
    if idle_full is not None:
        return Slot(gpu_id=g.id, node=g.node, model=model.name, profile=full.name, start=0,
                    size=full.memory_slices, compute=full.compute_slices, action="reuse", instance_id=idle_full.id)
    return create_slot(g, model, full, full.placements[0])
