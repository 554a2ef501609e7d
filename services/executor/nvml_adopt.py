"""``NvmlBackend``'s start-up reconciliation: adopt what a previous executor left, never tear it down.

Instances recorded in the state file that still exist stay this executor's own; others on the GPUs are foreign
(never destroyed unless ``destroy_foreign``). Recorded jobs whose process still runs are adopted and watched;
the others report their exit (status unknown) at the first poll. Differences between NVML's profile tables and
the built-in ones, and between the configured and the found GPU models, are noted and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from services.executor import nvml_ops
from services.executor.backend import InstanceInfo, Reconciliation
from services.executor.nvml_state import OwnedInstance, StateStore
from services.executor.process import AdoptedRun
from services.executor.workload import GroupRun, JobTable, Run
from shared.mig.geometry import GpuModel

if TYPE_CHECKING:
    from services.executor.nvml_discovery import NodeGpu

log = logging.getLogger("services.executor.nvml_backend")  # the backend's logger, as before the split
T = TypeVar("T")


class NvmlAdoption:
    """The reconciliation half of ``NvmlBackend``, which sets these attributes and provides these methods."""

    _store: StateStore
    _gpus: list[NodeGpu]
    _nvml: Any
    _jobs: JobTable
    _owned: set[OwnedInstance]
    _expected: tuple[str, ...]
    _grace: float
    _poll_s: float
    _keep_logs: bool
    reconciliation: Reconciliation

    if TYPE_CHECKING:

        async def _nv(self, action: str, fn: Callable[..., T], *args: Any) -> T: ...

        def _info(self, gpu: NodeGpu, model: GpuModel, raw: nvml_ops.RawInstance) -> InstanceInfo: ...

        def _save(self) -> None: ...

    async def _reconcile(self) -> None:
        state = self._store.load()
        recorded = set(state.instances)
        listed: list[tuple[NodeGpu, GpuModel, nvml_ops.RawInstance]] = []
        for gpu in self._gpus:
            if gpu.model is None:
                continue
            raws = await self._nv(
                f"list instances on GPU {gpu.index}",
                nvml_ops.list_instances,
                self._nvml,
                gpu.handle,
                gpu.model,
            )
            listed += [(gpu, gpu.model, raw) for raw in raws]
        present = {
            OwnedInstance(gpu_uuid=g.raw.uuid, gi_id=r.gi_id, profile_id=r.profile_id, start=r.start)
            for g, _, r in listed
        }
        self._owned = recorded & present
        notes = [
            f"instance {o.gi_id} (profile id {o.profile_id} @{o.start}) on {o.gpu_uuid} recorded as ours "
            "no longer exists"
            for o in sorted(recorded - present, key=lambda o: (o.gpu_uuid, o.gi_id))
        ]
        existing = {(g.raw.uuid, r.gi_id): self._info(g, m, r) for g, m, r in listed}
        for gpu in self._gpus:
            notes += [f"GPU {gpu.index}: {d}" for d in gpu.differences]
        by_uuid = {g.raw.uuid: g for g in self._gpus}
        adopted: list[str] = []
        lost: list[str] = []
        started_by: dict[str, str] = {}
        for rec in state.jobs:
            owner = by_uuid.get(rec.gpu_uuid)
            instance = existing.get((rec.gpu_uuid, rec.instance.gi_id), rec.instance)
            if owner is not None and instance.gpu_index != owner.index:  # indices can change across reboots
                instance = msgspec.structs.replace(instance, gpu_index=owner.index)
            run = AdoptedRun(instance, rec.pid, rec.start_time, Path(rec.log), self._poll_s, self._keep_logs)
            run.gpu_uuid = rec.gpu_uuid
            (adopted if run.alive() and owner is not None else lost).append(rec.job_id)
            if rec.started_by:
                started_by[rec.job_id] = rec.started_by
            if rec.more:  # a gang's part started per GPU: all its processes, one run again
                parts: list[Run] = [run]
                for p in rec.more:
                    more = AdoptedRun(p.instance, p.pid, p.start_time, Path(p.log), self._poll_s, self._keep_logs)
                    more.gpu_uuid = p.gpu_uuid or rec.gpu_uuid
                    parts.append(more)
                group = GroupRun(instance, parts, self._grace)
                group.started_by = rec.started_by
                self._jobs.add(rec.job_id, group)
                continue
            run.started_by = rec.started_by
            self._jobs.add(rec.job_id, run)  # one that ended reports its exit at the first poll (its keeper's status)
        found = sorted(g.builtin.name if g.builtin else g.raw.name for g in self._gpus)
        if self._expected and sorted(self._expected) != found:
            notes.append(f"configured models {sorted(self._expected)} differ from the GPUs found {found}")
        self.reconciliation = Reconciliation(
            owned_instances=len(self._owned),
            foreign_instances=len(existing) - sum(1 for i in existing.values() if i.owned),
            adopted_jobs=tuple(adopted),
            lost_jobs=tuple(lost),
            started_by=started_by,
            notes=tuple(notes),
        )
        self._save()
        for line in notes:
            log.warning("reconciliation: %s", line)
