"""Simulated MIG GPUs: the driver's placement rules over the geometry tables, timers instead of processes.

Create/destroy obey the same rules as the driver (legal start, no overlap, max count per profile) and fail
with the same typed errors, so the live stack exercises every path it would take on real GPUs. Each GI
operation takes ``reconfig_latency_s / speedup`` (asyncio sleep, one at a time per GPU like the driver).
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from services.executor import nvml_codes
from services.executor.backend import (
    BackendError,
    GpuInfo,
    InstanceInfo,
    InUseError,
    Reconciliation,
    WorkloadError,
    WorkloadExit,
    WorkloadSpec,
)
from services.executor.nvml_errors import error_for_code, not_mig_error
from services.executor.process import DEFAULT_ENV_ALLOWLIST, launch, launch_group, log_path
from services.executor.workload import JobTable, Run, SleepRun
from shared.errors import UnknownModelError
from shared.mig.geometry import Geometry, GpuModel, default_geometry
from shared.mig.occupancy import span

_NS = uuid.UUID("6f1c7e52-9a43-4d2b-8d5e-6b1f0c3a9e10")


def _free_gi_id(gis: Mapping[int, InstanceInfo]) -> int:
    """The lowest GI id from 1 to 63 not in use (the driver's choice for a GI smaller than the GPU)."""
    for gi_id in range(1, 64):
        if gi_id not in gis:
            return gi_id
    raise ValueError("every GI id from 1 to 63 is in use")


class SimBackend:
    name = "sim"

    def __init__(
        self,
        *,
        node: str,
        models: Sequence[str],
        reconfig_latency_s: float = 0.15,
        speedup: float = 1.0,
        geometry: Geometry | None = None,
        mig_disabled: Sequence[int] = (),
        workloads: str = "sleep",
        env_allowlist: Sequence[str] = DEFAULT_ENV_ALLOWLIST,
        log_dir: Path | None = None,
    ) -> None:
        if speedup <= 0:
            raise ValueError("speedup must be > 0")
        geo = geometry or default_geometry()
        self.node = node
        self._models: list[GpuModel] = [geo.model(m) for m in models]
        self._latency = reconfig_latency_s / speedup
        self._speedup = speedup
        self._mig_disabled = frozenset(mig_disabled)
        self._gis: list[dict[int, InstanceInfo]] = [{} for _ in self._models]
        self._listed: list[tuple[InstanceInfo, ...] | None] = [None for _ in self._models]
        """``list_instances`` of each GPU, by placement; None once the GPU's instances change."""
        self._locks = [asyncio.Lock() for _ in self._models]
        self._jobs = JobTable()
        self._faults: dict[str, list[int]] = {"create": [], "destroy": []}
        self._serial = 0
        self._processes = workloads == "process"
        """Run each workload's argv as a real process (``MIGSCHED_EXECUTOR_SIM_WORKLOADS=process``)."""
        self._allowlist = tuple(env_allowlist)
        self._log_dir = log_dir or Path(tempfile.gettempdir()) / "migsched-sim-logs" / node
        self.reconciliation = Reconciliation()

    # ---- fault knobs (tests and chaos runs) ----

    def fail_next(self, op: str, code: int = nvml_codes.UNKNOWN) -> None:
        """Make the next ``op`` ("create" or "destroy") fail with NVML ``code`` (queued, one per call)."""
        self._faults[op].append(code)

    # ---- discovery ----

    def gpu_uuid(self, index: int) -> str:
        return "GPU-" + str(uuid.uuid5(_NS, f"{self.node}/{index}"))

    def gpu_model(self, gpu_index: int) -> GpuModel:
        return self._gpu(gpu_index)

    async def discover(self) -> Sequence[GpuInfo]:
        return [
            GpuInfo(
                index=i,
                uuid=self.gpu_uuid(i),
                model=m.name,
                pci_device_id=m.pci_device_ids[0] if m.pci_device_ids else "",
                mig_enabled=i not in self._mig_disabled,
                mig_pending=i not in self._mig_disabled,
                memory_gib=m.memory_gib,
            )
            for i, m in enumerate(self._models)
        ]

    def _gpu(self, gpu_index: int) -> GpuModel:
        if not 0 <= gpu_index < len(self._models):
            raise BackendError(
                f"node {self.node} has no GPU {gpu_index}", code=nvml_codes.INVALID_ARGUMENT
            )
        return self._models[gpu_index]

    def _mig_gpu(self, gpu_index: int) -> GpuModel:
        model = self._gpu(gpu_index)
        if gpu_index in self._mig_disabled:
            raise not_mig_error(gpu_index, 0, 0)
        return model

    async def list_instances(self, gpu_index: int) -> Sequence[InstanceInfo]:
        self._mig_gpu(gpu_index)
        listed = self._listed[gpu_index]
        if listed is None:  # sorted once per change of the GPU, not per call (several per command)
            listed = self._listed[gpu_index] = tuple(
                sorted(self._gis[gpu_index].values(), key=lambda i: (i.start, i.gi_id))
            )
        return list(listed)

    # ---- GI operations ----

    async def create_instance(self, gpu_index: int, profile_id: int, start: int) -> InstanceInfo:
        model = self._mig_gpu(gpu_index)
        async with self._locks[gpu_index]:
            await asyncio.sleep(self._latency)
            try:
                profile = model.profile_by_id(profile_id)
            except UnknownModelError:
                raise error_for_code(
                    nvml_codes.INVALID_ARGUMENT, f"create profile id {profile_id} on GPU {gpu_index}"
                ) from None
            action = f"create {profile.name}@{start} on GPU {gpu_index}"
            if self._faults["create"]:
                raise error_for_code(self._faults["create"].pop(0), action)
            if start not in profile.placements:
                raise error_for_code(nvml_codes.INVALID_ARGUMENT, action)
            gis = self._gis[gpu_index]
            used = 0
            for gi in gis.values():
                used |= span(gi.size, gi.start)
            same = sum(1 for gi in gis.values() if gi.profile_id == profile_id)
            if used & span(profile.memory_slices, start) or same >= profile.max_count:
                raise error_for_code(nvml_codes.INSUFFICIENT_RESOURCES, action)
            gi_id = 0 if profile.memory_slices == model.memory_slices else _free_gi_id(gis)
            self._serial += 1
            info = InstanceInfo(
                gpu_index=gpu_index,
                gi_id=gi_id,
                ci_id=0,
                profile_id=profile_id,
                profile=profile.name,
                start=start,
                size=profile.memory_slices,
                uuid="MIG-" + str(uuid.uuid5(_NS, f"{self.gpu_uuid(gpu_index)}/{gi_id}/{self._serial}")),
                owned=True,
            )
            gis[gi_id] = info
            self._listed[gpu_index] = None
            return info

    async def destroy_instance(self, gpu_index: int, gi_id: int) -> None:
        self._mig_gpu(gpu_index)
        async with self._locks[gpu_index]:
            gis = self._gis[gpu_index]
            action = f"destroy GI {gi_id} on GPU {gpu_index}"
            if gi_id not in gis:
                return  # already gone: destroy is idempotent (commands are redelivered)
            job = self._jobs.job_on(gpu_index, gi_id)
            if job is not None:
                raise InUseError(
                    f"{action} refused: job {job} is running on it", code=nvml_codes.IN_USE
                )
            await asyncio.sleep(self._latency)
            if self._faults["destroy"]:
                raise error_for_code(self._faults["destroy"].pop(0), action)
            del gis[gi_id]
            self._listed[gpu_index] = None

    # ---- workloads ----

    def _check_instance(self, instance: InstanceInfo) -> None:
        if instance.plain:  # whole GPU(s) or a share: the GPUs must not be in MIG mode (no GI to find)
            for i in instance.gpus:
                self._gpu(i)
                if i not in self._mig_disabled:
                    raise BackendError(
                        f"GPU {i} is in MIG mode: a whole-GPU or time-sliced job cannot run on it",
                        code=nvml_codes.INVALID_ARGUMENT,
                    )
            return
        self._mig_gpu(instance.gpu_index)
        if instance.gi_id not in self._gis[instance.gpu_index]:
            raise error_for_code(
                nvml_codes.NOT_FOUND, f"start workload on GPU {instance.gpu_index} GI {instance.gi_id}"
            )

    def _duration(self, spec: WorkloadSpec) -> float | None:
        return None if spec.duration_s is None else spec.duration_s / self._speedup

    async def start_workload(self, job_id: str, instance: InstanceInfo, spec: WorkloadSpec) -> bool:
        self._check_instance(instance)
        if self._jobs.check_can_start(job_id, instance):
            return False
        self._jobs.add(job_id, await self._run(job_id, instance, spec))
        return True

    async def _run(self, job_id: str, instance: InstanceInfo, spec: WorkloadSpec) -> Run:
        run = await self._start(job_id, instance, spec)
        run.started_by = spec.started_by
        return run

    async def _start(self, job_id: str, instance: InstanceInfo, spec: WorkloadSpec) -> Run:
        """A timer for the duration hint, or (process mode) the workload's argv as real processes bound to the
        simulated GPUs' UUIDs (a MIG instance's UUID is made up from its place)."""
        if not self._processes:
            return SleepRun(instance, self._duration(spec))
        bound = instance
        if instance.plain:
            bound = msgspec.structs.replace(instance, uuid=",".join(self.gpu_uuid(i) for i in instance.gpus))
        elif not instance.uuid.startswith("MIG-"):
            bound = msgspec.structs.replace(
                instance, uuid="MIG-" + str(uuid.uuid5(_NS, f"{self.node}/{instance.gpu_index}/{instance.gi_id}")))

        def log() -> Path:
            self._serial += 1
            return log_path(self._log_dir, job_id, self._serial)

        if spec.procs:
            group, _ = await launch_group(job_id, bound, spec, logs=log, allowlist=self._allowlist, grace_s=1.0)
            return group
        run, _ = await launch(job_id, bound, spec, log=log(), allowlist=self._allowlist)
        return run

    async def move_workload(
        self, job_id: str, target: InstanceInfo, spec: WorkloadSpec, *, confirm_s: float | None = None
    ) -> None:
        if target.plain:
            raise WorkloadError(f"cannot move job {job_id}: jobs on whole GPUs or time-sliced shares never move")
        self._check_instance(target)
        busy = self._jobs.job_on(target.gpu_index, target.gi_id)
        if busy is not None:
            raise InUseError(f"move target GPU {target.gpu_index} GI {target.gi_id} is busy with job {busy}")

        async def start() -> Run:
            return await self._run(job_id, target, spec)

        await self._jobs.move(
            job_id, start, confirm_s=confirm_s if confirm_s is not None else 0.0, grace_s=0.0
        )

    async def stop_workload(self, job_id: str) -> None:
        await self._jobs.stop(job_id, grace_s=0.0)

    async def next_exit(self) -> WorkloadExit:
        return await self._jobs.next_exit()

    def exits_ready(self, limit: int) -> list[WorkloadExit]:
        return self._jobs.exits_ready(limit)

    def running(self) -> Mapping[str, InstanceInfo]:
        return self._jobs.running()

    def jobs_on(self, gpu_index: int) -> Mapping[int, str]:
        return self._jobs.jobs_on(gpu_index)

    async def close(self) -> None:
        if self._processes:  # real processes no later sim executor adopts: the node takes them with it
            await asyncio.gather(*(self._jobs.stop(job, 2.0) for job in list(self._jobs.running())))
        await self._jobs.close()
