"""``jobs.*`` messages: a job's submit (with its opaque ``Workload``), cancel and exit."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from shared.events.envelope import Message
from shared.events.fields import (
    Arg,
    EnvName,
    ExitKind,
    GpuId,
    InstanceId,
    JobId,
    Label,
    LabelValue,
    NodeName,
    Priority,
    ProfileName,
    Reason,
    Seconds,
    Tenant,
    Timestamp,
)
from shared.policy.request import Demand


class Workload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Opaque to the scheduler; the executor runs it bound to the job's MIG instance."""

    argv: Annotated[tuple[Arg, ...], msgspec.Meta(max_length=256)] = ()
    env: Annotated[
        dict[EnvName, Annotated[str, msgspec.Meta(max_length=8192)]], msgspec.Meta(max_length=128)
    ] = {}
    run_as: (
        Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z_][a-z0-9_-]*$")] | None
    ) = None
    launch: Literal["per-gpu", "per-node"] | None = None
    """How a gang (``gpus: n``, n > 1) starts on each of its nodes: ``per-gpu`` (the default) once per GPU, each
    process seeing its one GPU; ``per-node`` once per node with all of that node's GPUs. Either way each process
    gets ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``, ``NNODES``,
    ``MASTER_ADDR``, ``MASTER_PORT`` and ``MIGSCHED_GANG_HOSTS``. Other jobs ignore it."""


class Topology(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Keep a gang within one topology domain: the nodes that share the value of the ``level`` label they
    declared at registration (``MIGSCHED_NODE_LABELS``). ``required``: wait until one domain holds it (nodes
    without the label are in none); ``preferred``: one domain if any holds it now, else across domains."""

    level: Literal["block", "rack"]
    mode: Literal["required", "preferred"] = "preferred"


class JobSubmit(Message, frozen=True, kw_only=True):
    """``jobs.submit``: one job. ``id`` dedupes the message; ``job_id`` is the job (re-submitting a known job
    is a no-op)."""

    job_id: JobId
    tenant: Tenant = "default"
    priority: Priority = 0
    priority_class: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None
    demand: Demand
    latency_sensitive: bool = False
    migratable: bool = True
    duration_hint_s: Seconds | None = None
    patience_s: Seconds | None = None
    """Longest wait in the queue before the job is rejected; None waits forever."""
    workload: Workload = Workload()
    # a msgspec field (ruff cannot see that ``Message`` is a Struct): the default is copied per instance
    labels: Annotated[dict[Label, LabelValue], msgspec.Meta(max_length=64)] = {}  # noqa: RUF012
    submitted_at: Timestamp
    topology: Topology | None = None
    """A gang (``gpus: n``) within one block or rack of nodes; other jobs ignore it."""


class JobCancel(Message, frozen=True, kw_only=True):
    """``jobs.cancel``: cancel a pending or running job (a no-op for a finished one)."""

    job_id: JobId
    reason: Reason = ""
    at: Timestamp


class SlotRef(msgspec.Struct, frozen=True, kw_only=True):
    """One (GPU, instance) a job holds."""

    gpu_id: GpuId
    instance_id: InstanceId


class JobExit(Message, frozen=True, kw_only=True):
    """``jobs.exit``: a job left its instance. Published by the node registry after the release transition."""

    job_id: JobId
    node: NodeName
    gpu_id: GpuId
    instance_id: InstanceId
    status: Annotated[int, msgspec.Meta(ge=-255, le=255)] = 0
    kind: ExitKind
    reason: Reason = ""
    at: Timestamp
    profile: ProfileName | None = None
    slots: Annotated[tuple[SlotRef, ...], msgspec.Meta(max_length=64)] = ()
    """A gang (whole GPUs on one node): every slot it held, all released (``gpu_id``/``instance_id`` is the
    first). Empty for a single-slot job."""
