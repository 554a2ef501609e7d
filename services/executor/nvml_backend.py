"""The real backend: MIG instances through NVML (pynvml), workloads as processes bound to their instance.

Every NVML call runs in a worker thread (``asyncio.to_thread``); operations on one GPU are serialised by that
GPU's lock, as the driver serialises them anyway. Safety rules: MIG operations on a GPU not in MIG mode are
refused (the mode is never changed here; such a GPU runs whole-GPU jobs and time-sliced shares, bound by its
``GPU-`` UUID); at start-up existing instances and this executor's running jobs are adopted, never torn
down; only instances this executor created are destroyed unless ``destroy_foreign``. The ``nvml`` argument is
the module to call (default: the real ``pynvml``; tests pass ``nvml_fake.FakeNvml``).

This module holds the backend itself (NVML plumbing, discovery, MIG instance operations); its start-up
reconciliation is in ``nvml_adopt`` and its workloads in ``nvml_workloads``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from services.executor import nvml_ops
from services.executor.backend import (
    BackendError,
    BackendUnavailableError,
    GpuInfo,
    InstanceInfo,
    InUseError,
    NotOwnedError,
    Reconciliation,
)
from services.executor.nvml_adopt import NvmlAdoption
from services.executor.nvml_discovery import NodeGpu, build_model, compare, match_builtin, read_gpu
from services.executor.nvml_errors import error_for_code, not_mig_error, translate
from services.executor.nvml_state import JobRecord, OwnedInstance, PartProcess, StateFile, StateStore
from services.executor.nvml_workloads import NvmlWorkloads
from services.executor.process import DEFAULT_ENV_ALLOWLIST, AdoptedRun, ProcessRun
from services.executor.workload import GroupRun, JobTable
from shared.errors import GeometryError, MigschedError, UnknownModelError
from shared.mig.geometry import Geometry, GpuModel, default_geometry

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_STATE_DIR = "/var/lib/migsched/executor"


class NvmlBackend(NvmlAdoption, NvmlWorkloads):
    name = "nvml"

    def __init__(
        self,
        *,
        node: str,
        expected_models: Sequence[str] = (),
        nvml: Any = None,
        state_dir: str | Path = DEFAULT_STATE_DIR,
        env_allowlist: Sequence[str] = DEFAULT_ENV_ALLOWLIST,
        destroy_foreign: bool = False,
        in_use_retry_s: float = 2.0,
        stop_grace_s: float = 10.0,
        confirm_s: float = 1.0,
        adopt_poll_s: float = 1.0,
        keep_logs: bool = False,
        geometry: Geometry | None = None,
    ) -> None:
        self.node = node
        self._nvml = nvml if nvml is not None else pynvml
        self._expected = tuple(expected_models)
        self._store = StateStore(state_dir, node)
        self._allowlist = tuple(env_allowlist)
        self._destroy_foreign = destroy_foreign
        self._in_use_retry_s = in_use_retry_s
        self._grace = stop_grace_s
        self._confirm_s = confirm_s
        self._poll_s = adopt_poll_s
        self._keep_logs = keep_logs
        self._geometry = geometry
        self._gpus: list[NodeGpu] = []
        self._locks: list[asyncio.Lock] = []
        self._owned: set[OwnedInstance] = set()
        self._jobs = JobTable(on_change=self._save)
        self._start_lock = asyncio.Lock()
        self._started = False
        self._inited = False
        self._serial = 0
        self.reconciliation = Reconciliation()

    # ---- plumbing ----

    async def _nv(self, action: str, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in a worker thread; NVML errors become typed errors naming ``action``."""
        try:
            return await asyncio.to_thread(fn, *args)
        except pynvml.NVMLError as exc:
            raise translate(exc, action) from exc

    async def _ensure(self) -> None:
        if self._started:
            return
        async with self._start_lock:
            if self._started:
                return
            self._store.ensure()
            await self._nv("initialise NVML and read the GPUs", self._init_sync)
            self._locks = [asyncio.Lock() for _ in self._gpus]
            await self._reconcile()
            self._started = True

    def _init_sync(self) -> None:
        if not self._inited:  # nvmlInit is reference-counted: once per backend
            self._nvml.nvmlInit()
            self._inited = True
        geometry = self._geometry or default_geometry()
        self._gpus = []
        for index in range(self._nvml.nvmlDeviceGetCount()):
            raw = read_gpu(self._nvml, index)
            builtin = match_builtin(raw, geometry)
            model, diffs = None, []
            if raw.mig_current == 1:
                try:
                    model = build_model(raw, builtin, node=self.node)
                except GeometryError as exc:
                    raise BackendUnavailableError(
                        f"GPU {index} ({raw.name}): the MIG profile table NVML reports is unusable ({exc}); "
                        "run `migsched gpu-check` and report it"
                    ) from exc
                diffs = compare(raw, builtin)
                for line in diffs:
                    log.warning(
                        "GPU %d (%s): NVML differs from the built-in table: %s", index, raw.name, line
                    )
            handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
            self._gpus.append(NodeGpu(index, handle, raw, builtin, model, diffs))

    def _gpu(self, index: int) -> NodeGpu:
        if not 0 <= index < len(self._gpus):
            raise error_for_code(
                pynvml.NVML_ERROR_INVALID_ARGUMENT, f"use GPU {index} (node has {len(self._gpus)})"
            )
        return self._gpus[index]

    def _mig_gpu(self, index: int) -> tuple[NodeGpu, GpuModel]:
        gpu = self._gpu(index)
        if gpu.model is None:
            raise not_mig_error(index, gpu.raw.mig_current, gpu.raw.mig_pending)
        return gpu, gpu.model

    def _info(self, gpu: NodeGpu, model: GpuModel, raw: nvml_ops.RawInstance) -> InstanceInfo:
        try:
            profile = model.profile_by_id(raw.profile_id).name
        except UnknownModelError:
            profile = f"id{raw.profile_id}"
        key = OwnedInstance(
            gpu_uuid=gpu.raw.uuid, gi_id=raw.gi_id, profile_id=raw.profile_id, start=raw.start
        )
        return InstanceInfo(
            gpu_index=gpu.index,
            gi_id=raw.gi_id,
            ci_id=raw.ci_ids[0] if raw.ci_ids else None,
            profile_id=raw.profile_id,
            profile=profile,
            start=raw.start,
            size=raw.size,
            uuid=raw.uuid,
            owned=key in self._owned,
        )

    def _save(self) -> None:
        jobs = []
        for job_id, run in self._jobs.runs().items():
            procs = [r for r in run.runs if isinstance(r, (ProcessRun, AdoptedRun))] if isinstance(
                run, GroupRun) else [run] if isinstance(run, (ProcessRun, AdoptedRun)) else []
            if not procs:
                continue
            first = procs[0]
            jobs.append(
                JobRecord(
                    job_id=job_id,
                    gpu_uuid=first.gpu_uuid or self._gpus[run.instance.gpu_index].raw.uuid,
                    instance=run.instance,
                    pid=first.pid,
                    start_time=first.start_time,
                    log=str(first.log),
                    more=[PartProcess(instance=p.instance, pid=p.pid, start_time=p.start_time, log=str(p.log),
                                      gpu_uuid=p.gpu_uuid or self._gpus[p.instance.gpu_index].raw.uuid)
                          for p in procs[1:]],
                    started_by=run.started_by,
                )
            )
        owned = sorted(self._owned, key=lambda o: (o.gpu_uuid, o.gi_id))
        self._store.save(StateFile(node=self.node, instances=owned, jobs=jobs))

    # ---- discovery ----

    async def discover(self) -> Sequence[GpuInfo]:
        await self._ensure()
        out = []
        for g in self._gpus:
            ref = g.model or g.builtin
            out.append(
                GpuInfo(
                    index=g.index,
                    uuid=g.raw.uuid,
                    model=g.builtin.name if g.builtin else g.raw.name,
                    pci_device_id=g.raw.pci_device_id,
                    mig_enabled=g.raw.mig_current == 1,
                    mig_pending=None if g.raw.mig_pending is None else g.raw.mig_pending == 1,
                    memory_gib=ref.memory_gib if ref else 0.0,
                )
            )
        return out

    def gpu_model(self, gpu_index: int) -> GpuModel:
        """The profile table NVML reported for this GPU (it wins over the built-in table on this node)."""
        return self._mig_gpu(gpu_index)[1]

    def differences(self, gpu_index: int) -> list[str]:
        return list(self._gpu(gpu_index).differences)

    async def list_instances(self, gpu_index: int) -> Sequence[InstanceInfo]:
        await self._ensure()
        gpu, model = self._mig_gpu(gpu_index)
        async with self._locks[gpu_index]:
            raws = await self._nv(
                f"list instances on GPU {gpu_index}", nvml_ops.list_instances, self._nvml, gpu.handle, model
            )
        return [self._info(gpu, model, r) for r in raws]

    # ---- GI operations ----

    async def create_instance(self, gpu_index: int, profile_id: int, start: int) -> InstanceInfo:
        await self._ensure()
        gpu, model = self._mig_gpu(gpu_index)
        try:
            profile = model.profile_by_id(profile_id)
        except UnknownModelError:
            known = ", ".join(f"{p.name}={p.profile_id}" for p in model.profiles)
            raise BackendError(
                f"GPU {gpu_index} ({model.name}) offers no profile ID {profile_id}; its profile IDs: {known}",
                code=pynvml.NVML_ERROR_INVALID_ARGUMENT,
            ) from None
        action = f"create {profile.name} (ID {profile_id}) at memory slice {start} on GPU {gpu_index}"
        async with self._locks[gpu_index]:
            raw = await self._nv(
                action, nvml_ops.create, self._nvml, gpu.handle, profile_id, start, profile.memory_slices
            )
            self._owned.add(
                OwnedInstance(
                    gpu_uuid=gpu.raw.uuid, gi_id=raw.gi_id, profile_id=raw.profile_id, start=raw.start
                )
            )
            self._save()
        return self._info(gpu, model, raw)

    async def destroy_instance(self, gpu_index: int, gi_id: int) -> None:
        await self._ensure()
        gpu, _model = self._mig_gpu(gpu_index)
        action = f"destroy GI {gi_id} on GPU {gpu_index}"
        job = self._jobs.job_on(gpu_index, gi_id)
        if job is not None:
            raise InUseError(f"{action} refused: job {job} is running on it", code=pynvml.NVML_ERROR_IN_USE)
        mine = next((o for o in self._owned if o.gpu_uuid == gpu.raw.uuid and o.gi_id == gi_id), None)
        if mine is None and not self._destroy_foreign:
            if any(i.gi_id == gi_id for i in await self.list_instances(gpu_index)):
                raise NotOwnedError(
                    f"{action} refused: this executor did not create it (set "
                    "MIGSCHED_EXECUTOR_DESTROY_FOREIGN=1 to allow)"
                )
            return  # already gone: destroy is idempotent
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._in_use_retry_s
        delay = 0.02
        while True:
            async with self._locks[gpu_index]:
                try:
                    await asyncio.to_thread(nvml_ops.destroy, self._nvml, gpu.handle, gi_id)
                    break
                except pynvml.NVMLError as exc:
                    if exc.value != pynvml.NVML_ERROR_IN_USE:
                        raise translate(exc, action) from exc
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise InUseError(
                    f"{action} failed: still in use after retrying for {self._in_use_retry_s:g} s "
                    "(a process is running on it, or it was just released)",
                    code=pynvml.NVML_ERROR_IN_USE,
                )
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.25)
        if mine is not None:
            self._owned.discard(mine)
        self._save()

    async def close(self) -> None:
        """Stop watching; workloads keep running and instances stay (a restarted executor adopts them)."""
        await self._jobs.close()
        if self._inited:
            self._inited = False
            try:
                await asyncio.to_thread(self._nvml.nvmlShutdown)
            except (pynvml.NVMLError, MigschedError) as exc:
                log.warning("nvmlShutdown failed: %s", exc)
