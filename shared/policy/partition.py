"""Partition planning: turn a placement slot into the ordered, idempotent MIG operations for one GPU.

Order: destroy each idle instance in the way (compute instance first, then GPU instance), create the GPU
instance at the exact placement, create its full compute instance. Every operation names its target so that an
executor can skip one that is already done (idempotent replay after a crash). A busy instance is never touched:
if one is in the way the plan is a ``PlanConflict`` (the decision was made on a stale snapshot).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from shared.mig.geometry import GpuModel
from shared.policy.placement.decision import Slot
from shared.policy.snapshot import GpuView

OpKind = Literal["destroy_ci", "destroy_gi", "create_gi", "create_ci"]


class MigOp(msgspec.Struct, frozen=True, kw_only=True):
    kind: OpKind
    gpu_id: str
    instance_id: str
    profile: str
    profile_id: int
    start: int
    size: int


class PartitionPlan(msgspec.Struct, frozen=True, kw_only=True):
    gpu_id: str
    instance_id: str
    """The instance the job will run on (created by this plan, or reused)."""
    ops: tuple[MigOp, ...]

    @property
    def reconfigurations(self) -> int:
        """GPU instances created plus destroyed: what the reconfiguration latency is charged on."""
        return sum(1 for op in self.ops if op.kind in ("create_gi", "destroy_gi"))


class PlanConflict(msgspec.Struct, frozen=True, kw_only=True):
    gpu_id: str
    reason: str


def new_instance_id(gpu_id: str, profile: str, start: int, nonce: str) -> str:
    """Deterministic for one decision, so a replayed command creates the same instance id."""
    return f"{gpu_id}:{profile}@{start}:{nonce}"


def plan_partition(gpu: GpuView, model: GpuModel, slot: Slot, nonce: str) -> PartitionPlan | PlanConflict:
    """The operations that make ``slot`` real on ``gpu``; ``nonce`` (the job id) names the new instance."""
    if slot.gpu_id != gpu.id:
        return PlanConflict(gpu_id=gpu.id, reason=f"slot is for {slot.gpu_id}, not {gpu.id}")
    if slot.action == "reuse":
        inst = gpu.instance(slot.instance_id or "")
        if inst is None:
            return PlanConflict(gpu_id=gpu.id, reason=f"idle instance {slot.instance_id} no longer exists")
        if inst.busy:
            return PlanConflict(gpu_id=gpu.id, reason=f"instance {inst.id} is now busy with {inst.job_id}")
        return PartitionPlan(gpu_id=gpu.id, instance_id=inst.id, ops=())
    profile = model.profile(slot.profile)
    if slot.start not in profile.placements:
        return PlanConflict(gpu_id=gpu.id, reason=f"{profile.name} cannot start at {slot.start}")
    pm = profile.placement_mask(slot.start)
    ops: list[MigOp] = []
    same = 0
    for inst in gpu.instances:
        # ``inst.mask``, inlined (the simulator plans every placement here)
        if not (((1 << inst.size) - 1) << inst.start) & pm:
            if inst.profile == profile.name:
                same += 1  # an instance of the profile that stays: it counts towards the max count
            continue
        if inst.busy:
            return PlanConflict(
                gpu_id=gpu.id, reason=f"busy instance {inst.id} ({inst.job_id}) overlaps {profile.name}@{slot.start}"
            )
        p = model.profile(inst.profile)
        for kind in ("destroy_ci", "destroy_gi"):
            ops.append(MigOp(kind=kind, gpu_id=gpu.id, instance_id=inst.id, profile=p.name,
                             profile_id=p.profile_id, start=inst.start, size=inst.size))
    if same >= profile.max_count:
        return PlanConflict(gpu_id=gpu.id, reason=f"{profile.name} is at its max count {profile.max_count}")
    iid = new_instance_id(gpu.id, profile.name, slot.start, nonce)
    for kind in ("create_gi", "create_ci"):
        ops.append(MigOp(kind=kind, gpu_id=gpu.id, instance_id=iid, profile=profile.name,  # type: ignore[arg-type]
                         profile_id=profile.profile_id, start=slot.start, size=profile.memory_slices))
    return PartitionPlan(gpu_id=gpu.id, instance_id=iid, ops=tuple(ops))
