"""``NvmlBackend``'s workloads: processes bound to a MIG instance (its fresh MIG UUID) or to whole GPUs / one
time-sliced share (their ``GPU-`` UUIDs), started, moved, stopped and watched through the backend's ``JobTable``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import pynvml

from services.executor.backend import GpuInfo, InstanceInfo, InUseError, WorkloadError, WorkloadExit, WorkloadSpec
from services.executor.nvml_errors import error_for_code
from services.executor.nvml_state import StateStore
from services.executor.plain import check_plain
from services.executor.process import ProcessRun, launch, launch_group, log_path
from services.executor.workload import GroupRun, JobTable

if TYPE_CHECKING:
    from services.executor.nvml_discovery import NodeGpu

log = logging.getLogger("services.executor.nvml_backend")  # the backend's logger, as before the split


class NvmlWorkloads:
    """The workload half of ``NvmlBackend``, which sets these attributes and provides these methods."""

    _store: StateStore
    _jobs: JobTable
    _allowlist: tuple[str, ...]
    _keep_logs: bool
    _serial: int
    _confirm_s: float
    _grace: float

    if TYPE_CHECKING:

        async def _ensure(self) -> None: ...

        def _gpu(self, index: int) -> NodeGpu: ...

        async def discover(self) -> Sequence[GpuInfo]: ...

        async def list_instances(self, gpu_index: int) -> Sequence[InstanceInfo]: ...

    async def _resolve(self, instance: InstanceInfo) -> InstanceInfo:
        """The instance as NVML sees it now (fresh MIG UUID); NOT_FOUND if it was destroyed."""
        for info in await self.list_instances(instance.gpu_index):
            if info.gi_id == instance.gi_id:
                return info
        raise error_for_code(
            pynvml.NVML_ERROR_NOT_FOUND,
            f"find GI {instance.gi_id} on GPU {instance.gpu_index} for a workload",
        )

    def _log(self, job_id: str) -> Path:
        self._serial += 1
        return log_path(self._store.log_dir, job_id, self._serial)

    async def _launch(self, job_id: str, instance: InstanceInfo, spec: WorkloadSpec) -> ProcessRun | GroupRun:
        run = await self._processes(job_id, instance, spec)
        run.started_by = spec.started_by
        return run

    async def _processes(self, job_id: str, instance: InstanceInfo, spec: WorkloadSpec) -> ProcessRun | GroupRun:
        if spec.procs:  # a gang's part started per GPU (or per node): several processes, one run
            group, dropped = await launch_group(job_id, instance, spec, logs=lambda: self._log(job_id),
                                                allowlist=self._allowlist, keep_log=self._keep_logs,
                                                grace_s=self._grace)
            if dropped:
                log.warning("job %s: environment variables not in the allowlist were dropped: %s", job_id, dropped)
            return group
        self._serial += 1
        run, dropped = await launch(
            job_id,
            instance,
            spec,
            allowlist=self._allowlist,
            keep_log=self._keep_logs,
            log=log_path(self._store.log_dir, job_id, self._serial),
        )
        if dropped:
            log.warning(
                "job %s: environment variables not in the allowlist were dropped: %s", job_id, dropped
            )
        return run

    async def start_workload(self, job_id: str, instance: InstanceInfo, spec: WorkloadSpec) -> bool:
        await self._ensure()
        if self._jobs.check_can_start(job_id, instance):
            return False  # redelivered command: already running there
        if instance.plain:  # whole GPU(s) or a share: bound to the GPUs, which must not be in MIG mode
            check_plain(instance, await self.discover())
            uuids = ",".join(self._gpu(i).raw.uuid for i in instance.gpus)
            current = msgspec.structs.replace(instance, uuid=uuids)
        else:
            current = await self._resolve(instance)
        self._jobs.add(job_id, await self._launch(job_id, current, spec))
        return True

    async def move_workload(
        self, job_id: str, target: InstanceInfo, spec: WorkloadSpec, *, confirm_s: float | None = None
    ) -> None:
        await self._ensure()
        if target.plain:
            raise WorkloadError(f"cannot move job {job_id}: jobs on whole GPUs or time-sliced shares never move")
        current = await self._resolve(target)
        busy = self._jobs.job_on(current.gpu_index, current.gi_id)
        if busy is not None:
            raise InUseError(
                f"move target GPU {current.gpu_index} GI {current.gi_id} is busy with job {busy}"
            )

        async def start() -> ProcessRun | GroupRun:
            return await self._launch(job_id, current, spec)

        wait = self._confirm_s if confirm_s is None else confirm_s
        await self._jobs.move(job_id, start, confirm_s=wait, grace_s=self._grace)

    async def stop_workload(self, job_id: str) -> None:
        await self._jobs.stop(job_id, self._grace)

    async def next_exit(self) -> WorkloadExit:
        return await self._jobs.next_exit()

    def exits_ready(self, limit: int) -> list[WorkloadExit]:
        return self._jobs.exits_ready(limit)

    def running(self) -> Mapping[str, InstanceInfo]:
        return self._jobs.running()

    def jobs_on(self, gpu_index: int) -> Mapping[int, str]:
        return self._jobs.jobs_on(gpu_index)
