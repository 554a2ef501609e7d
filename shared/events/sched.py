"""``sched.*`` messages, the scheduling decisions: a committed placement (``Placed``), a reserved migration
(``MigrateOrder``, ``MoveSpec``), a capacity change; and ``JobInfo``, the job fields carried along with them."""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec

from shared.events.envelope import Message
from shared.events.fields import (
    GpuId,
    InstanceId,
    JobId,
    NodeName,
    Priority,
    ProfileName,
    Reason,
    Seconds,
    Size,
    Slice,
    Tenant,
    Timestamp,
)
from shared.events.jobs import Workload
from shared.policy.placement.decision import Placement
from shared.policy.snapshot import GpuView


def wire_gpu(gpu: GpuView) -> GpuView:
    """``gpu`` fit for JSON: "never moved" (-inf) becomes 0.0, which the policies read the same way."""
    if all(math.isfinite(i.last_moved_at) for i in gpu.instances):
        return gpu
    return msgspec.structs.replace(
        gpu,
        instances=tuple(
            i if math.isfinite(i.last_moved_at) else msgspec.structs.replace(i, last_moved_at=0.0)
            for i in gpu.instances
        ),
    )


class JobInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The job fields the node registry and the executor need, carried along so that they never read the job."""

    tenant: Tenant = "default"
    priority: Priority = 0
    latency_sensitive: bool = False
    migratable: bool = True
    duration_hint_s: Seconds | None = None
    workload: Workload = Workload()
    submitted_at: Timestamp = 0.0


class Placed(Message, frozen=True, kw_only=True):
    """``sched.placed``: a committed reservation. ``gpu`` is the GPU as the decision saw it (before the
    reservation); the compare-and-set on ``gpu_version`` proved it current, so the place command is planned from it
    without reading Redis."""

    job_id: JobId
    placement: Placement
    gpu: GpuView
    gpu_version: Annotated[int, msgspec.Meta(ge=0)]
    job: JobInfo
    attempt: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 0
    decided_at: Timestamp
    preempted: Annotated[tuple[JobId, ...], msgspec.Meta(max_length=64)] = ()
    """Jobs preempted for this placement (already re-queued in the state store; ``gpu`` shows their instances
    idle): the node must stop their workloads before it destroys or reuses those instances, so the command
    carries them as ``stop_jobs`` ahead of its ops."""


class MoveSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A migration move as planned by ``shared.policy.migration`` (same field names as its ``Move``)."""

    job_id: JobId
    kind: Literal["intra", "inter"]
    src_gpu: GpuId
    src_instance: InstanceId
    src_profile: ProfileName
    src_start: Slice
    dst_gpu: GpuId
    dst_profile: ProfileName
    dst_start: Slice
    dst_size: Size
    destroy: tuple[InstanceId, ...] = ()
    frag_src_before: float = 0.0
    frag_src_after: float = 0.0
    frag_dst_before: float = 0.0
    frag_dst_after: float = 0.0
    expected_change: float = 0.0
    reason: Reason = ""


class MigrateOrder(Message, frozen=True, kw_only=True):
    """``sched.migrate``: a reserved move. ``dst_gpu_view`` is the target before the reservation."""

    move: MoveSpec
    src_node: NodeName
    dst_node: NodeName
    dst_instance: InstanceId
    nonce: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]
    """Names the target instance (``new_instance_id(dst_gpu, profile, start, nonce)``) and the move's
    commands."""
    dst_gpu_view: GpuView
    job: JobInfo
    decided_at: Timestamp


class Preempted(Message, frozen=True, kw_only=True):
    """``sched.preempted``: a job was preempted so that ``by`` could be placed (a higher priority, or a tenant
    taking back the quota it lent). The victim is back in the queue already, with its original submit time; its
    node stops it before the placement's ops run. For observers: nothing in the stack consumes it."""

    job_id: JobId
    by: JobId
    tenant: Tenant = "default"
    """The victim's tenant."""
    priority: Priority = 0
    """The victim's priority."""
    reason: Reason = ""
    """Why this job was chosen (``Victim.detail``: below the preemptor's priority, or over its tenant's quota)."""
    lost_work_s: Seconds = 0.0
    """Work since the victim's last checkpoint, as the preemption policy priced it."""
    gpu_ids: Annotated[tuple[GpuId, ...], msgspec.Meta(max_length=4096)] = ()
    """The GPUs it ran on (several for a gang)."""
    at: Timestamp


class CapacityChanged(Message, frozen=True, kw_only=True):
    """``sched.capacity``: GPUs gained room (registration, destroyed instance, failed placement, lost node)"""

    gpu_ids: Annotated[tuple[GpuId, ...], msgspec.Meta(max_length=4096)] = ()
    reason: Reason = ""
    at: Timestamp
