"""Wire schemas (msgspec Structs, JSON) and subject names: the contract between migsched's processes.

Every message carries ``v`` (schema version) and ``id`` (unique per message; it is also the JetStream
``Nats-Msg-Id``, so a republished message is dropped by the server's duplicate window). Schemas only grow: new
fields get defaults, unknown fields are ignored on decode. Bounds (lengths, ranges, patterns) are part of the
types, so ``migsched schema`` (``json_schemas()``) gives publishers in any language what the decoder enforces.

Who publishes what (DESIGN §2, §4; ``docs/architecture.md`` has the whole flow):

=====================================  ===================  ===========================================
subject                                 message              publisher -> consumers
=====================================  ===================  ===========================================
``jobs.submit``                         ``JobSubmit``        external queues, client -> balancer
``jobs.cancel``                         ``JobCancel``        external, client -> balancer, partitioner
``jobs.exit``                           ``JobExit``          partitioner (from node reports) -> all three
``sched.placed``                        ``Placed``           balancer -> partitioner
``sched.migrate``                       ``MigrateOrder``     migration-planner -> partitioner
``sched.capacity``                      ``CapacityChanged``  partitioner -> balancer (backfill)
``cmd.<node>``                          ``Command``          partitioner -> executor of <node>
``node.<node>.report``                  ``NodeReport``       executor -> partitioner (node registry)
``node.<node>.heartbeat``               ``Heartbeat``        executor -> partitioner (node registry)
``dlq.<original subject>``              the original bytes   bus consumer loop (header Migsched-Error)
=====================================  ===================  ===========================================

Executors publish only on their own ``node.<node>.*`` subjects (issue 7 gives them no other rights); the node
registry validates a report against the state and re-publishes a job's exit on ``jobs.exit``.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from shared.errors import MigschedError
from shared.mig.geometry import Geometry, default_geometry
from shared.policy.partition import MigOp
from shared.policy.placement import Placement
from shared.policy.request import Demand, resolve_profile
from shared.policy.snapshot import GpuView

SCHEMA_VERSION = 1

# --- bounded scalar types -----------------------------------------------------------------------------------
MsgId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/+~-]*$")
]
JobId = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")]
NodeName = Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")]
"""A node name is one NATS subject token: no dots or wildcards."""
GpuId = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]
InstanceId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=300, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]*$")
]
Tenant = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
Priority = Annotated[int, msgspec.Meta(ge=-1000, le=1000)]
Timestamp = Annotated[float, msgspec.Meta(ge=0, le=1e11)]
"""Seconds since the Unix epoch."""
Seconds = Annotated[float, msgspec.Meta(ge=0, le=1e8)]
Reason = Annotated[str, msgspec.Meta(max_length=2000)]
Label = Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")]
LabelValue = Annotated[str, msgspec.Meta(max_length=256)]
EnvName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Arg = Annotated[str, msgspec.Meta(max_length=4096)]
ProfileName = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Slice = Annotated[int, msgspec.Meta(ge=0, le=7)]
Size = Annotated[int, msgspec.Meta(ge=1, le=8)]
ExitKind = Literal["completed", "failed", "cancelled", "preempted", "lost"]
CommandKind = Literal["place", "stop", "migrate_start", "migrate_stop", "destroy_idle", "resync"]


class DecodeError(MigschedError, ValueError):
    """A message cannot be decoded or fails validation. ``reason`` is short and specific (it goes into the
    dead-letter message's ``Migsched-Error`` header)."""

    def __init__(self, reason: str, subject: str = "") -> None:
        super().__init__(f"{subject}: {reason}" if subject else reason)
        self.reason = reason
        self.subject = subject


def new_id(prefix: str = "m") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every message: schema version and unique message id."""

    v: Annotated[int, msgspec.Meta(ge=1, le=1000)] = SCHEMA_VERSION
    id: MsgId


# --- jobs.* -------------------------------------------------------------------------------------------------
class Workload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Opaque to the scheduler; the executor runs it bound to the job's MIG instance."""

    argv: Annotated[tuple[Arg, ...], msgspec.Meta(max_length=256)] = ()
    env: Annotated[
        dict[EnvName, Annotated[str, msgspec.Meta(max_length=8192)]], msgspec.Meta(max_length=128)
    ] = {}
    run_as: (
        Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z_][a-z0-9_-]*$")] | None
    ) = None


class JobSubmit(Message, frozen=True, kw_only=True):
    """``jobs.submit``: one job. ``id`` dedupes the message; ``job_id`` is the job (re-submitting a known job
    is a
    no-op)."""

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
    labels: Annotated[dict[Label, LabelValue], msgspec.Meta(max_length=64)] = {}
    submitted_at: Timestamp


class JobCancel(Message, frozen=True, kw_only=True):
    """``jobs.cancel``: cancel a pending or running job (a no-op for a finished one)."""

    job_id: JobId
    reason: Reason = ""
    at: Timestamp


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


# --- sched.* ------------------------------------------------------------------------------------------------
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
    """The job fields the partitioner and the executor need, carried along so that they never read the job."""

    tenant: Tenant = "default"
    priority: Priority = 0
    latency_sensitive: bool = False
    migratable: bool = True
    duration_hint_s: Seconds | None = None
    workload: Workload = Workload()
    submitted_at: Timestamp = 0.0


class Placed(Message, frozen=True, kw_only=True):
    """``sched.placed``: a committed reservation. ``gpu`` is the GPU as the decision saw it (before the
    reservation); the compare-and-set on ``gpu_version`` proved it current, so the partitioner plans from it
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


class CapacityChanged(Message, frozen=True, kw_only=True):
    """``sched.capacity``: GPUs gained room (registration, destroyed instance, failed placement, lost node)"""

    gpu_ids: Annotated[tuple[GpuId, ...], msgspec.Meta(max_length=4096)] = ()
    reason: Reason = ""
    at: Timestamp


# --- cmd.<node> ---------------------------------------------------------------------------------------------
class Command(Message, frozen=True, kw_only=True):
    """``cmd.<node>``: one idempotent order for one executor. ``id`` == ``cmd_id``; replaying a command
    whose ops are done must be harmless (each op names its target instance).

    kinds: ``place`` (stop ``stop_jobs`` first, preempted: no exit is reported for them; then apply ``ops`` in
    order, then start ``workload`` for ``job_id`` on ``instance_id``);
    ``stop`` (stop ``job_id``; the executor reports its exit with kind cancelled);
    ``migrate_start`` (``ops`` then start ``job_id`` on the target ``instance_id`` while it still runs on
    ``src_instance_id``); ``migrate_stop`` (stop ``job_id``'s workload on ``src_instance_id`` only, without a
    job exit); ``destroy_idle`` (apply ``ops``: destroy an idle instance); ``resync`` (stop ``stop_jobs``,
    then register again).
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


# --- node.<node>.* ------------------------------------------------------------------------------------------
class InstanceReport(msgspec.Struct, frozen=True, kw_only=True):
    """A MIG instance an executor found or created (``InstanceInfo`` of ``services.executor.backend``)."""

    instance_id: InstanceId | None = None
    """migsched's id when the executor knows it (created by a command); None for one found on the GPU."""
    gi_id: Annotated[int, msgspec.Meta(ge=0, le=1023)] = 0
    ci_id: Annotated[int, msgspec.Meta(ge=0, le=1023)] | None = None
    profile: ProfileName
    profile_id: Annotated[int, msgspec.Meta(ge=0, le=255)] = 0
    start: Slice
    size: Size
    uuid: Annotated[str, msgspec.Meta(max_length=128)] = ""
    job_id: JobId | None = None


class GpuReport(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU of a registering node (``GpuInfo`` of ``services.executor.backend`` plus its instances)."""

    index: Annotated[int, msgspec.Meta(ge=0, le=1023)]
    uuid: Annotated[str, msgspec.Meta(max_length=128)] = ""
    model: ProfileName
    mig_enabled: bool = True
    healthy: bool = True
    instances: Annotated[tuple[InstanceReport, ...], msgspec.Meta(max_length=8)] = ()


class _Report(Message, frozen=True, kw_only=True, tag_field="kind"):
    node: NodeName
    at: Timestamp


class Registered(_Report, frozen=True, kw_only=True, tag="registered"):
    gpus: Annotated[tuple[GpuReport, ...], msgspec.Meta(min_length=1, max_length=64)]
    backend: Annotated[str, msgspec.Meta(max_length=32)] = "sim"


class CmdDone(_Report, frozen=True, kw_only=True, tag="cmd_done"):
    cmd_id: MsgId
    command: CommandKind
    job_id: JobId | None = None
    instance: InstanceReport | None = None


class CmdFailed(_Report, frozen=True, kw_only=True, tag="cmd_failed"):
    cmd_id: MsgId
    command: CommandKind
    job_id: JobId | None = None
    error: Reason
    code: int | None = None


class JobStarted(_Report, frozen=True, kw_only=True, tag="job_started"):
    job_id: JobId
    instance_id: InstanceId


class JobExited(_Report, frozen=True, kw_only=True, tag="job_exit"):
    job_id: JobId
    gpu_index: Annotated[int, msgspec.Meta(ge=0, le=1023)] | None = None
    instance_id: InstanceId | None = None
    status: Annotated[int, msgspec.Meta(ge=-255, le=255)] = 0
    exit: ExitKind = "completed"
    reason: Reason = ""


class Drift(_Report, frozen=True, kw_only=True, tag="drift"):
    gpu_index: Annotated[int, msgspec.Meta(ge=0, le=1023)] | None = None
    details: Annotated[tuple[Reason, ...], msgspec.Meta(max_length=64)] = ()


NodeReport = Registered | CmdDone | CmdFailed | JobStarted | JobExited | Drift


class Heartbeat(Message, frozen=True, kw_only=True):
    node: NodeName
    seq: Annotated[int, msgspec.Meta(ge=0)]
    at: Timestamp
    running: Annotated[tuple[JobId, ...], msgspec.Meta(max_length=4096)] = ()


# --- subjects -----------------------------------------------------------------------------------------------
_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


class Subjects:
    """Subject and stream names of one namespace. ``Subjects("")`` gives the DESIGN names."""

    def __init__(self, namespace: str = "") -> None:
        if namespace and not _TOKEN.match(namespace):
            raise ValueError(f"namespace {namespace!r} must be one subject token ([A-Za-z0-9_-])")
        self.namespace = namespace
        self.root = f"{namespace}." if namespace else ""
        s = f"{namespace}_" if namespace else ""
        r = self.root
        self.jobs_submit = f"{r}jobs.submit"
        self.jobs_cancel = f"{r}jobs.cancel"
        self.jobs_exit = f"{r}jobs.exit"
        self.sched_placed = f"{r}sched.placed"
        self.sched_migrate = f"{r}sched.migrate"
        self.sched_capacity = f"{r}sched.capacity"
        self.node_reports = f"{r}node.*.report"
        self.node_heartbeats = f"{r}node.*.heartbeat"
        self.stream_jobs, self.stream_sched = f"{s}JOBS", f"{s}SCHED"
        self.stream_cmd, self.stream_node, self.stream_dlq = f"{s}CMD", f"{s}NODE", f"{s}DLQ"

    def cmd(self, node: str) -> str:
        return f"{self.root}cmd.{node}"

    def node_report(self, node: str) -> str:
        return f"{self.root}node.{node}.report"

    def node_heartbeat(self, node: str) -> str:
        return f"{self.root}node.{node}.heartbeat"

    def dlq(self, subject: str) -> str:
        rel = subject[len(self.root) :] if self.root and subject.startswith(self.root) else subject
        return f"{self.root}dlq.{rel}"

    def streams(self) -> dict[str, list[str]]:
        """Stream name -> its subjects: one stream per concern (DESIGN §4)."""
        r = self.root
        return {
            self.stream_jobs: [f"{r}jobs.>"],
            self.stream_sched: [f"{r}sched.>"],
            self.stream_cmd: [f"{r}cmd.>"],
            self.stream_node: [f"{r}node.>"],
            self.stream_dlq: [f"{r}dlq.>"],
        }

    def kind_of(self, subject: str) -> tuple[str, str | None]:
        """(kind, node or None); kind: submit|cancel|exit|placed|migrate|capacity|cmd|report|heartbeat."""
        if self.root:
            if not subject.startswith(self.root):
                raise DecodeError("subject outside this namespace", subject)
            subject = subject[len(self.root) :]
        parts = subject.split(".")
        if len(parts) == 2 and parts[0] == "jobs" and parts[1] in ("submit", "cancel", "exit"):
            return parts[1], None
        if len(parts) == 2 and parts[0] == "sched" and parts[1] in ("placed", "migrate", "capacity"):
            return parts[1], None
        if len(parts) == 2 and parts[0] == "cmd":
            return "cmd", parts[1]
        if len(parts) == 3 and parts[0] == "node" and parts[2] in ("report", "heartbeat"):
            return parts[2], parts[1]
        raise DecodeError("unknown subject", subject)


# --- decoding -----------------------------------------------------------------------------------------------
_TYPES: dict[str, Any] = {
    "submit": JobSubmit,
    "cancel": JobCancel,
    "exit": JobExit,
    "placed": Placed,
    "migrate": MigrateOrder,
    "capacity": CapacityChanged,
    "cmd": Command,
    "report": NodeReport,
    "heartbeat": Heartbeat,
}
_DECODERS = {k: msgspec.json.Decoder(t) for k, t in _TYPES.items()}
_ENCODER = msgspec.json.Encoder()
MAX_MESSAGE_BYTES = 256 * 1024


def encode(msg: msgspec.Struct) -> bytes:
    return _ENCODER.encode(msg)


def check_demand(demand: Demand, geometry: Geometry | None = None) -> None:
    """Raise DecodeError unless the demand is coherent and some known GPU model can serve it."""
    from shared.errors import RequestError

    try:
        demand.check()
    except RequestError as exc:
        raise DecodeError(f"invalid demand: {exc}") from None
    if demand.kind != "mig":
        return
    geometry = geometry or default_geometry()
    if not any(resolve_profile(demand, m) is not None for m in geometry.models):
        raise DecodeError(f"unknown profile: no GPU model has a profile for {demand.label()}")


def decode(
    subject: str, data: bytes, subjects: Subjects | None = None, geometry: Geometry | None = None
) -> Any:
    """The message on ``subject``, validated; ``DecodeError`` with a specific reason otherwise.

    Semantic checks beyond the schema: a submit's demand is coherent and servable by a known GPU model; a node
    message's ``node`` matches the node token of its subject (an executor cannot speak for another node).
    """
    subjects = subjects or _DEFAULT_SUBJECTS
    kind, node = subjects.kind_of(subject)
    if len(data) > MAX_MESSAGE_BYTES:
        raise DecodeError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}", subject)
    try:
        msg = _DECODERS[kind].decode(data)
    except msgspec.ValidationError as exc:
        raise DecodeError(f"invalid: {exc}", subject) from None
    except msgspec.DecodeError as exc:
        raise DecodeError(f"malformed JSON: {exc}", subject) from None
    except RecursionError:  # adversarial nesting ([[[[...]]]]): msgspec gives up past the recursion limit
        raise DecodeError("malformed JSON: nested too deeply", subject) from None
    if kind == "submit":
        try:
            check_demand(msg.demand, geometry)
        except DecodeError as exc:
            raise DecodeError(exc.reason, subject) from None
    elif node is not None and getattr(msg, "node", node) != node:
        raise DecodeError(f"node {msg.node!r} in a message on {node!r}'s subject", subject)
    return msg


_DEFAULT_SUBJECTS = Subjects("")

EXTERNAL: Mapping[str, Any] = {
    "JobSubmit": JobSubmit,
    "JobCancel": JobCancel,
    "JobExit": JobExit,
    "Placed": Placed,
    "MigrateOrder": MigrateOrder,
    "CapacityChanged": CapacityChanged,
    "Command": Command,
    "NodeReport": NodeReport,
    "Heartbeat": Heartbeat,
}


def json_schemas() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of every message, keyed by message name, for ``migsched schema``."""
    out: dict[str, Any] = {}
    for name, t in EXTERNAL.items():
        schema = msgspec.json.schema(t)
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema.setdefault("title", name)
        out[name] = schema
    return out


def now() -> float:
    return time.time()
