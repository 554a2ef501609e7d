"""``node.<node>.*`` messages, what an executor says about its node: the reports (``NodeReport``: registered,
command done or failed, job started or exited, drift) and the heartbeat."""

from __future__ import annotations

from typing import Annotated

import msgspec

from shared.events.envelope import Message
from shared.events.fields import (
    CommandKind,
    ExitKind,
    InstanceId,
    JobId,
    Label,
    LabelValue,
    MsgId,
    NodeName,
    ProfileName,
    Reason,
    Size,
    Slice,
    Timestamp,
)


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
    started_by: MsgId | None = None
    """The command that started ``job_id``'s run on it, when the executor knows it: a stop of that run names
    it, so a later run of the job on an instance of the same id is left alone."""


class GpuReport(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU of a registering node (``GpuInfo`` of ``services.executor.backend`` plus its instances)."""

    index: Annotated[int, msgspec.Meta(ge=0, le=1023)]
    uuid: Annotated[str, msgspec.Meta(max_length=128)] = ""
    model: ProfileName
    mig_enabled: bool = True
    healthy: bool = True
    instances: Annotated[tuple[InstanceReport, ...], msgspec.Meta(max_length=8)] = ()
    replicas: Annotated[int, msgspec.Meta(ge=0, le=64)] = 0
    """A GPU not in MIG mode: time-sliced into this many shares (0: whole-GPU jobs only). Ignored in MIG mode."""
    jobs: Annotated[tuple[JobId, ...], msgspec.Meta(max_length=1024)] = ()
    """A GPU not in MIG mode: the jobs running on it (whole or shared), so a re-registration keeps them."""


class _Report(Message, frozen=True, kw_only=True, tag_field="kind"):
    node: NodeName
    at: Timestamp


class Registered(_Report, frozen=True, kw_only=True, tag="registered"):
    gpus: Annotated[tuple[GpuReport, ...], msgspec.Meta(min_length=1, max_length=64)]
    backend: Annotated[str, msgspec.Meta(max_length=32)] = "sim"
    labels: Annotated[dict[Label, LabelValue], msgspec.Meta(max_length=32)] = {}  # noqa: RUF012
    """The node's topology labels (``MIGSCHED_NODE_LABELS``): ``block`` and ``rack`` group nodes for gangs, and
    ``block`` names the node's shard when there are several."""
    addr: Annotated[str, msgspec.Meta(max_length=253, pattern=r"^[A-Za-z0-9.:_-]*$")] = ""
    """Where the node's workloads can be reached (``MIGSCHED_NODE_ADDR``): a gang whose first member is here
    gets it as ``MASTER_ADDR``."""


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
    started_by: MsgId | None = None
    """The command that started the run that ended (None: not known, e.g. a run adopted after an executor
    restart). A run started by a place command of an earlier attempt than the job's current one belongs to a
    placement that is gone: its exit changes nothing, even when it names the instance the job runs on now."""


class Drift(_Report, frozen=True, kw_only=True, tag="drift"):
    gpu_index: Annotated[int, msgspec.Meta(ge=0, le=1023)] | None = None
    details: Annotated[tuple[Reason, ...], msgspec.Meta(max_length=64)] = ()


NodeReport = Registered | CmdDone | CmdFailed | JobStarted | JobExited | Drift


class RunningSlot(msgspec.Struct, frozen=True, kw_only=True):
    """Where a job runs on the node: the MIG instance (GPU index, profile, start) its workload is bound to."""

    job_id: JobId
    gpu_index: Annotated[int, msgspec.Meta(ge=0, le=1023)]
    profile: ProfileName
    start: Slice


class RunStart(msgspec.Struct, frozen=True, kw_only=True):
    """Which command started a job's run on the node (``WorkloadSpec.started_by``): a ``stop`` naming it as
    ``src_cmd_id`` ends that run only, never a later one of the same job."""

    job_id: JobId
    cmd_id: MsgId


class ToldExit(msgspec.Struct, frozen=True, kw_only=True):
    """A ``job_exit`` report the node published a moment ago, repeated in its heartbeats: the node registry
    applies one it never received (a consumer can skip a stored message when its stream's leader changes).
    The fields are the report's (same ``id``), the node is the heartbeat's, the reason is cut short."""

    id: MsgId
    at: Timestamp
    job_id: JobId
    gpu_index: Annotated[int, msgspec.Meta(ge=0, le=1023)] | None = None
    instance_id: InstanceId | None = None
    status: Annotated[int, msgspec.Meta(ge=-255, le=255)] = 0
    exit: ExitKind = "completed"
    reason: Annotated[str, msgspec.Meta(max_length=256)] = ""
    started_by: MsgId | None = None

    @classmethod
    def of(cls, r: JobExited) -> ToldExit:
        return cls(id=r.id, at=r.at, job_id=r.job_id, gpu_index=r.gpu_index, instance_id=r.instance_id,
                   status=r.status, exit=r.exit, reason=r.reason[:256], started_by=r.started_by)

    def report(self, node: str) -> JobExited:
        """The report as the node published it (its reason cut short)."""
        return JobExited(id=self.id, node=node, at=self.at, job_id=self.job_id, gpu_index=self.gpu_index,
                         instance_id=self.instance_id, status=self.status, exit=self.exit, reason=self.reason,
                         started_by=self.started_by)


class Heartbeat(Message, frozen=True, kw_only=True):
    node: NodeName
    seq: Annotated[int, msgspec.Meta(ge=0)]
    at: Timestamp
    running: Annotated[tuple[JobId, ...], msgspec.Meta(max_length=4096)] = ()
    slots: Annotated[tuple[RunningSlot, ...], msgspec.Meta(max_length=4096)] = ()
    """Of ``running``, the jobs on a MIG instance and where: ``migsched check --executors`` holds them against
    the state's instance (plain bindings are left out)."""
    started: Annotated[tuple[RunStart, ...], msgspec.Meta(max_length=4096)] = ()
    """Of ``running``, the command that started each run, where the node knows it: the node registry stops a
    run of a job re-queued or placed on other nodes by that command alone."""
    exits: Annotated[tuple[ToldExit, ...], msgspec.Meta(max_length=64)] = ()
    """The ``job_exit`` reports published one to ten seconds before (at most 64, the newest): the registry
    applies those it did not receive, once overdue, to jobs its state still has running."""
