"""The executor's backend interface: what a node's GPUs can do, whether simulated or real (NVML).

The ``sim`` backend and the ``nvml`` backend both implement ``Backend``; one contract test suite runs against
both. All methods are async because real MIG operations take 0.1-1 s and must not block the event loop
(NVML calls run in a worker thread).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import msgspec

from services.executor.launch import Proc
from shared.errors import MigschedError


class BackendError(MigschedError):
    """A GPU operation failed. ``code`` is the backend's own code (an NVML return code for nvml)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class InUseError(BackendError):
    """The instance still has processes (or was just released): retry shortly."""


class NotMigModeError(BackendError):
    """The GPU is not in MIG mode; migsched never changes the mode itself."""


class InsufficientResourcesError(BackendError):
    """The requested placement overlaps an existing instance or the profile is at its max count."""


class NotOwnedError(BackendError):
    """The instance was not created by this executor (adopted/foreign) and ``destroy_foreign`` is off."""


class PermissionDeniedError(BackendError):
    """The operation needs privileges the executor lacks (NVML MIG ops and run-as need root)."""


class BackendUnavailableError(BackendError):
    """The backend cannot start at all (no NVML library, no driver, unwritable state dir)."""


class WorkloadError(BackendError):
    """A workload could not be started, stopped or moved (bad argv, unknown user, target died in a move)."""


class BusyInstanceError(WorkloadError):
    """The instance a job was to start on runs another job: the state took it for idle (drift)."""


class GpuInfo(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    uuid: str
    model: str
    """Canonical geometry model name (e.g. ``A100-40GB``), or the raw NVML name when unknown."""
    pci_device_id: str = ""
    mig_enabled: bool = True
    mig_pending: bool | None = None
    memory_gib: float = 0.0


class InstanceInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A GPU instance with its full-size compute instance."""

    gpu_index: int
    gi_id: int
    ci_id: int | None
    profile_id: int
    profile: str
    start: int
    size: int
    uuid: str = ""
    """The MIG device UUID (``MIG-...``) for ``CUDA_VISIBLE_DEVICES``; empty until the CI exists."""
    owned: bool = True
    """Created by this executor (adopted ones are never destroyed unless configured)."""
    gpus: tuple[int, ...] = ()
    """A plain binding (``services.executor.plain``): the non-MIG GPUs a workload runs on, whole or as one
    time-sliced share; ``uuid`` then lists their ``GPU-...`` UUIDs. Empty for a MIG instance."""

    @property
    def plain(self) -> bool:
        return bool(self.gpus)


class WorkloadSpec(msgspec.Struct, frozen=True, kw_only=True):
    argv: tuple[str, ...] = ()
    env: Mapping[str, str] = {}
    run_as: str | None = None
    duration_s: float | None = None
    """Simulated run time (sim backend) or a hint."""
    bindings: tuple[InstanceInfo, ...] = ()
    """A gang on MIG GPUs: each process's own instance (``procs`` in order; its MIG device). Empty: the processes
    share the binding the workload is started on (plain GPUs, one each by index)."""
    procs: tuple[Proc, ...] = ()
    """A gang's part (``services.executor.launch``): the processes to start, each on its own GPUs with its own
    variables, as one run that ends when all have ended (the first failure stops the others). Empty: one
    process on the whole binding."""
    started_by: str = ""
    """The command that starts this run: its exit carries it, so that the registry tells the exit of an earlier
    placement's run from the current one's, even on the same instance."""


class WorkloadExit(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    status: int
    """Exit code, or minus the signal number (``-15`` after a stop), as ``subprocess`` reports it."""
    reason: str = ""
    """``completed`` (status 0), ``failed``, ``stopped`` (stop_workload) or ``lost`` (``status_known``)."""
    output_tail: str = ""
    status_known: bool = True
    """False for a job adopted after an executor restart whose status its exit keeper did not record (the keeper
    was killed too): ``reason`` is then ``lost``."""
    instance: InstanceInfo | None = None
    """Where the run that ended ran (the job may already run again elsewhere: a replayed or retried place)."""
    started_by: str = ""
    """The command that started the run that ended (``WorkloadSpec.started_by``, kept across an executor restart
    by the nvml backend's state file; '' when not known)."""


class Reconciliation(msgspec.Struct, frozen=True, kw_only=True):
    """What a backend found at start-up: adopted rather than destroyed, plus any drift worth reporting."""

    owned_instances: int = 0
    foreign_instances: int = 0
    adopted_jobs: tuple[str, ...] = ()
    lost_jobs: tuple[str, ...] = ()
    """Jobs that ended while no executor watched them; their exits come through ``next_exit()`` with the status
    their keeper recorded, or as ``lost`` where none was."""
    started_by: dict[str, str] = {}
    """Adopted job -> the command that started its run, where the previous executor recorded it."""
    notes: tuple[str, ...] = ()


@runtime_checkable
class Backend(Protocol):
    name: str

    async def discover(self) -> Sequence[GpuInfo]: ...

    async def list_instances(self, gpu_index: int) -> Sequence[InstanceInfo]: ...

    async def create_instance(self, gpu_index: int, profile_id: int, start: int) -> InstanceInfo:
        """Create a GI at exactly ``start`` plus its full CI; return it with its MIG UUID."""
        ...

    async def destroy_instance(self, gpu_index: int, gi_id: int) -> None:
        """Destroy the CI(s) then the GI; retries the short in-use window, then raises InUseError."""
        ...

    async def start_workload(self, job_id: str, instance: InstanceInfo, spec: WorkloadSpec) -> bool:
        """Start the job's workload on ``instance``; False when it already runs there (a redelivered or late
        command), which starts nothing."""
        ...

    async def stop_workload(self, job_id: str) -> None: ...

    async def next_exit(self) -> WorkloadExit:
        """Wait for the next workload exit."""
        ...

    def exits_ready(self, limit: int) -> list[WorkloadExit]:
        """Up to ``limit`` exits already there, without waiting (the executor batches its exit reports)."""
        ...

    def running(self) -> Mapping[str, InstanceInfo]:
        """Job id -> the instance it runs on, for workloads this backend is running or has adopted.

        A read-only LIVE view (no copy per call: it is asked several times per command and per exit): it changes
        as workloads start, move and end. Take a copy to keep it across an ``await`` or to iterate it while
        workloads may change."""
        ...

    def jobs_on(self, gpu_index: int) -> Mapping[int, str]:
        """GI id -> the job running on it, on one GPU (plain bindings under their pseudo GI ids): a read-only
        live view, like ``running()``."""
        ...

    async def close(self) -> None: ...


async def move_workload(
    backend: Backend, job_id: str, target: InstanceInfo, spec: WorkloadSpec, *, confirm_s: float | None = None
) -> None:
    """Make-before-break migration: start ``job_id`` on ``target``, confirm it stays up, then stop the source.

    If the target copy exits during the confirmation window the source is left running and WorkloadError is
    raised; no exit is reported for the retired source copy (the job did not end, it moved).
    """
    mover = getattr(backend, "move_workload", None)
    if mover is None:
        raise WorkloadError(f"backend {backend.name!r} cannot move workloads")
    await mover(job_id, target, spec, confirm_s=confirm_s)
