"""``cmd.<node>`` messages: the node registry's idempotent orders to one executor (``Command``, ``PlainSlot``)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from shared.events.envelope import Message
from shared.events.fields import CommandKind, GpuId, InstanceId, JobId, MsgId, NodeName, Seconds, Timestamp
from shared.events.jobs import Workload
from shared.policy.partition import MigOp


class PlainSlot(msgspec.Struct, frozen=True, kw_only=True):
    """A ``place`` command's binding to a non-MIG GPU: the whole GPU (``gpu``) or one time-slice replica of it
    (``shared``). No MIG operation happens: the workload is started with the GPU's UUID."""

    gpu_index: Annotated[int, msgspec.Meta(ge=0, le=1023)]
    instance_id: InstanceId
    profile: Literal["gpu", "shared"] = "gpu"
    replica: Annotated[int, msgspec.Meta(ge=0, le=1023)] = 0


class MigMember(msgspec.Struct, frozen=True, kw_only=True):
    """A ``place`` of a gang on full-size MIG instances: one member GPU and the instance its process runs on
    (created by the command's ``ops``, or reused)."""

    gpu_index: Annotated[int, msgspec.Meta(ge=0, le=1023)]
    instance_id: InstanceId


class GangLaunch(msgspec.Struct, frozen=True, kw_only=True):
    """A gang's part on the node a ``place`` command goes to: how to start it, and the rendezvous every part
    shares. Ranks run node by node in ``hosts`` order, GPUs in ``plain`` order within a node."""

    launch: Literal["per-gpu", "per-node"] = "per-gpu"
    world_size: Annotated[int, msgspec.Meta(ge=1, le=4096)]
    first_rank: Annotated[int, msgspec.Meta(ge=0, le=4095)]
    """The global rank of this node's first GPU."""
    node_rank: Annotated[int, msgspec.Meta(ge=0, le=4095)]
    hosts: Annotated[tuple[NodeName, ...], msgspec.Meta(min_length=1, max_length=4096)]
    """Every member node, in rank order (``MIGSCHED_GANG_HOSTS``)."""
    master_addr: Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
    """The first member's address, as its executor declared it at registration (its node name if none)."""
    master_port: Annotated[int, msgspec.Meta(ge=1024, le=65535)]


class Command(Message, frozen=True, kw_only=True):
    """``cmd.<node>``: one idempotent order for one executor. ``id`` == ``cmd_id``; replaying a command
    whose ops are done must be harmless (each op names its target instance).

    kinds: ``place`` (stop ``stop_jobs`` first, preempted: no exit is reported for them; then apply ``ops`` in
    order, then start ``workload`` for ``job_id`` on ``instance_id``);
    ``stop`` (stop ``job_id``; the executor reports its exit with kind cancelled; also sent by the registry for
    a job a registration found running where the state does not hold it, ``instance_id`` naming where);
    A ``place`` with ``plain`` slots has no ops: it starts the workload on those whole GPUs (all of a gang,
    ``instance_id`` naming the first) or on one time-sliced share.
    ``migrate_start`` (``ops`` then start ``job_id`` on the target ``instance_id`` while it still runs on
    ``src_instance_id``); ``migrate_stop`` (stop ``job_id``'s workload on ``src_instance_id`` only, without a
    job exit); ``destroy_idle`` (apply ``ops``: destroy an idle instance); ``resync`` (stop **every** workload
    running on the node, ``stop_jobs`` first and also any started after the heartbeat they were read from:
    the node is lost or unknown, so the state holds no job there; then register again).
    """

    cmd_id: MsgId
    kind: CommandKind
    node: NodeName
    gpu_id: GpuId | None = None
    gpu_index: Annotated[int, msgspec.Meta(ge=0, le=1023)] | None = None
    ops: tuple[MigOp, ...] = ()
    instance_id: InstanceId | None = None
    src_instance_id: InstanceId | None = None
    job_id: JobId | None = None
    workload: Workload = Workload()
    duration_s: Seconds | None = None
    stop_jobs: tuple[JobId, ...] = ()
    at: Timestamp
    submitted_at: Timestamp = 0.0
    """The job's submit time, carried for submit -> command latency measurement."""
    plain: Annotated[tuple[PlainSlot, ...], msgspec.Meta(max_length=64)] = ()
    """``place`` on non-MIG GPUs: every GPU (or the one share) the workload is bound to."""
    mig_members: Annotated[tuple[MigMember, ...], msgspec.Meta(max_length=64)] = ()
    """``place`` of a gang on MIG GPUs: every member on this node, in rank order (``ops`` make them on each
    GPU; each process sees its one MIG device)."""
    gang: GangLaunch | None = None
    """``place`` of a gang (``gpus: n``, n > 1): this node's part and the environment of its processes."""
    src_cmd_id: MsgId | None = None
    """``stop`` of the run one command started (a ``place`` applied late): a run of the job that a later command
    started, even on an instance of the same id, is left alone."""
