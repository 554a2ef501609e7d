"""Wire schemas (msgspec Structs, JSON) and subject names: the contract between migsched's processes.

Every message carries ``v`` (schema version) and ``id`` (unique per message; it is also the JetStream
``Nats-Msg-Id``, so a republished message is dropped by the server's duplicate window). Schemas only grow: new
fields get defaults, unknown fields are ignored on decode. Bounds (lengths, ranges, patterns) are part of the
types, so ``migsched schema`` (``json_schemas()``) gives publishers in any language what the decoder enforces.

Who publishes what (``docs/architecture.md`` has the whole flow):

=====================================  ===================  ===========================================
subject                                 message              publisher -> consumers
=====================================  ===================  ===========================================
``jobs.submit``                         ``JobSubmit``        external queues, client -> balancer
``jobs.cancel``                         ``JobCancel``        external, client -> balancer, registry
``jobs.exit``                           ``JobExit``          registry (from node reports) -> all three
``sched.placed``                        ``Placed``           balancer -> registry
``sched.migrate``                       ``MigrateOrder``     migration-planner -> registry
``sched.capacity``                      ``CapacityChanged``  registry -> balancer (backfill)
``sched.preempted``                     ``Preempted``        balancer -> observers (none in the stack)
``cmd.<node>``                          ``Command``          registry -> executor of <node>
``node.<node>.report``                  ``NodeReport``       executor -> registry (node registry)
``node.<node>.heartbeat``               ``Heartbeat``        executor -> registry (node registry)
``dlq.<original subject>``              the original bytes   bus consumer loop (header Migsched-Error)
=====================================  ===================  ===========================================

Executors publish only on their own ``node.<node>.*`` subjects (their access rights give them no other); the node
registry validates a report against the state and re-publishes a job's exit on ``jobs.exit``.

The schemas, one module per concern (everything is re-exported here: import from ``shared.events``):

- ``fields``: the bounded scalar types (ids, names, priorities, timestamps, reasons);
- ``envelope``: ``Message`` (``v``, ``id``), ``new_id``, ``now``, ``DecodeError``;
- ``jobs``: ``jobs.*`` (``JobSubmit``, ``Workload``, ``JobCancel``, ``JobExit``, ``SlotRef``);
- ``sched``: ``sched.*``, the scheduling decisions (``Placed``, ``MigrateOrder``, ``MoveSpec``,
  ``CapacityChanged``, ``Preempted``, ``JobInfo``, ``wire_gpu``);
- ``commands``: ``cmd.<node>`` (``Command``, ``PlainSlot``);
- ``node``: ``node.<node>.*`` (``NodeReport`` and its kinds, ``GpuReport``, ``InstanceReport``, ``Heartbeat``,
  ``RunningSlot``, ``RunStart``, ``ToldExit``);
- ``subjects``: ``Subjects``, subject and stream names per namespace;
- ``codec``: ``decode``, ``encode``, ``check_demand``, ``json_schemas``.
"""

from __future__ import annotations

from shared.errors import MigschedError
from shared.events.codec import EXTERNAL, MAX_MESSAGE_BYTES, check_demand, decode, encode, json_schemas
from shared.events.commands import Command, GangLaunch, MigMember, PlainSlot
from shared.events.envelope import SCHEMA_VERSION, DecodeError, Message, new_id, now
from shared.events.fields import (
    Arg,
    CommandKind,
    EnvName,
    ExitKind,
    GpuId,
    InstanceId,
    JobId,
    Label,
    LabelValue,
    MsgId,
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
from shared.events.jobs import JobCancel, JobExit, JobSubmit, SlotRef, Topology, Workload
from shared.events.node import (
    CmdDone,
    CmdFailed,
    Drift,
    GpuReport,
    Heartbeat,
    InstanceReport,
    JobExited,
    JobStarted,
    NodeReport,
    Registered,
    RunningSlot,
    RunStart,
    ToldExit,
)
from shared.events.sched import CapacityChanged, JobInfo, MigrateOrder, MoveSpec, Placed, Preempted, wire_gpu
from shared.events.subjects import Subjects
from shared.mig.geometry import Geometry, default_geometry
from shared.policy.partition import MigOp
from shared.policy.placement.decision import Placement
from shared.policy.request import Demand, resolve_profile
from shared.policy.snapshot import GpuView

# every name of the former single module: ``from shared.events import X`` keeps working
__all__ = [
    "EXTERNAL",
    "MAX_MESSAGE_BYTES",
    "SCHEMA_VERSION",
    "Arg",
    "CapacityChanged",
    "CmdDone",
    "CmdFailed",
    "Command",
    "CommandKind",
    "DecodeError",
    "Demand",
    "Drift",
    "EnvName",
    "ExitKind",
    "GangLaunch",
    "Geometry",
    "GpuId",
    "GpuReport",
    "GpuView",
    "Heartbeat",
    "InstanceId",
    "InstanceReport",
    "JobCancel",
    "JobExit",
    "JobExited",
    "JobId",
    "JobInfo",
    "JobStarted",
    "JobSubmit",
    "Label",
    "LabelValue",
    "Message",
    "MigMember",
    "MigOp",
    "MigrateOrder",
    "MigschedError",
    "MoveSpec",
    "MsgId",
    "NodeName",
    "NodeReport",
    "Placed",
    "Placement",
    "PlainSlot",
    "Preempted",
    "Priority",
    "ProfileName",
    "Reason",
    "Registered",
    "RunStart",
    "RunningSlot",
    "Seconds",
    "Size",
    "Slice",
    "SlotRef",
    "Subjects",
    "Tenant",
    "Timestamp",
    "ToldExit",
    "Topology",
    "Workload",
    "check_demand",
    "decode",
    "default_geometry",
    "encode",
    "json_schemas",
    "new_id",
    "now",
    "resolve_profile",
    "wire_gpu",
]
