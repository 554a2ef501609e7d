"""A committed placement (``Placed``) -> the executor's ``place`` command, and its id.

Pure: the balancer sends the command right after its compare-and-set; the GPU view in ``Placed`` is the one the
compare-and-set proved current, so planning reads nothing. The node registry reads a command's id back
(``place_cmd_id``) to tell which attempt a report answers.
"""

from __future__ import annotations

from typing import Any

from shared.events import Command, Placed, PlainSlot
from shared.mig.geometry import Geometry
from shared.policy.partition import PartitionPlan, PlanConflict, new_instance_id, plan_partition
from shared.state.model import PLAIN_PROFILES


def place_cmd_id(job_id: str, attempt: int) -> str:
    return f"place:{job_id}:{attempt}"


def _place(p: Placed, cmd_id: str, now: float, **target: Any) -> Command:
    """The fields every place command of ``p`` has; ``target``: where it runs (index, instance, ops or plain)."""
    slot = p.placement.slot
    return Command(
        id=cmd_id,
        cmd_id=cmd_id,
        kind="place",
        node=slot.node,
        gpu_id=slot.gpu_id,
        job_id=p.job_id,
        workload=p.job.workload,
        duration_s=p.job.duration_hint_s,
        at=now,
        submitted_at=p.job.submitted_at,
        stop_jobs=p.preempted,
        **target,
    )


def _plain_place_command(p: Placed, cmd_id: str, now: float) -> Command:
    """A placement on non-MIG GPUs (every slot of a gang, or one share): no ops, the workload bound to the
    GPUs. The instance ids are the ones the balancer reserved (``new_instance_id`` of each slot)."""
    slots = tuple(
        PlainSlot(
            gpu_index=int(s.gpu_id.rsplit("/", 1)[1]),
            instance_id=new_instance_id(s.gpu_id, s.profile, s.start, p.job_id),
            profile="shared" if s.profile == "shared" else "gpu",
            replica=s.start if s.profile == "shared" else 0,
        )
        for s in p.placement.slots
    )
    return _place(p, cmd_id, now, gpu_index=slots[0].gpu_index, instance_id=slots[0].instance_id, plain=slots)


def place_command(p: Placed, geometry: Geometry, now: float) -> Command | PlanConflict:
    """The ``place`` command of ``p`` (MIG: destroy the idle instances in the way, create the instance at the
    exact placement, start the workload), or the conflict that forbids it (cannot happen after a
    compare-and-set on this view; a caller never acts on it but fails the placement)."""
    cmd_id = place_cmd_id(p.job_id, p.attempt)
    slot = p.placement.slot
    if slot.profile in PLAIN_PROFILES:
        return _plain_place_command(p, cmd_id, now)
    plan = plan_partition(p.gpu, geometry.model(slot.model), slot, p.job_id)
    if not isinstance(plan, PartitionPlan):
        return plan
    return _place(p, cmd_id, now, gpu_index=p.gpu.index, ops=plan.ops, instance_id=plan.instance_id)
