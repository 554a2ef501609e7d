"""Registration and start-up reconciliation: the executor reports every GPU with what it found on it.

Instances found are adopted, never torn down; a GPU not in MIG mode is reported with its time-slice
``replicas`` (from ``MIGSCHED_EXECUTOR_GPUS``) and the jobs bound to it. Anything that differs from what the
scheduler expects (a GPU whose MIG mode is not the configured one, a foreign instance, a model the tables do
not know, the backend's own notes) is reported as ``Drift``; jobs the backend could not re-attach to are
reported as exits of kind ``lost``.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from typing import Any

from services.executor.backend import Backend, InstanceInfo
from services.executor.config import ExecutorError, parse_gpu_specs, parse_labels
from services.executor.instances import InstanceBook, report
from shared.bus import Outgoing
from shared.events import Drift, GpuReport, InstanceReport, Registered, new_id, now
from shared.mig.geometry import default_geometry
from shared.ports import EventBus

_ADDR = re.compile(r"[A-Za-z0-9.:_-]+")


class Registration:
    def __init__(self, bus: EventBus, backend: Backend, book: InstanceBook, node: str, settings: Any,
                 started_by: dict[str, str] | None = None) -> None:
        self.bus = bus
        self.subjects = bus.subjects
        self.backend = backend
        self.book = book
        self.node = node
        self.settings = settings
        self.started_by: dict[str, str] = started_by if started_by is not None else {}
        """Per running job, the command that started it (``Runs.started_by``): reported with its instance. The
        runs a restarted executor adopted keep theirs (the backend's reconciliation)."""
        self.labels = parse_labels(settings.node_labels)
        self.addr = settings.node_addr or socket.gethostname()
        if not _ADDR.fullmatch(self.addr) or len(self.addr) > 253:
            raise ExecutorError(
                f"MIGSCHED_NODE_ADDR={self.addr!r} is not a host name or IP address (letters, digits, . : _ -)"
            )

    def _report(self, info: InstanceInfo, job: str | None) -> InstanceReport:
        return report(info, self.book.name_of(info), job, self.started_by.get(job) if job else None)

    async def register(self) -> None:
        """Report every GPU with the instances found on it (adopted, never torn down) and any drift."""
        geometry = default_geometry()
        gpus = await self.backend.discover()
        rec = getattr(self.backend, "reconciliation", None)
        if rec is not None:
            live = self.backend.running()
            for job, by in rec.started_by.items():
                if job in live:
                    self.started_by.setdefault(job, by)
        running = {(i.gpu_index, i.gi_id): job for job, i in self.backend.running().items()}
        plain_jobs: dict[int, list[str]] = {}  # GPU index -> jobs bound to it whole or as a share
        for job, i in self.backend.running().items():
            for index in i.gpus:
                plain_jobs.setdefault(index, []).append(job)
        specs = parse_gpu_specs(self.settings.executor_gpus)
        reports, drift = [], []
        node_model = getattr(self.backend, "gpu_model", None)
        for g in gpus:
            try:
                # the NVML view of a MIG GPU's profiles wins over the built-in table on this node
                if node_model is not None and g.mig_enabled:
                    self.book.models[g.index] = node_model(g.index)
                else:
                    self.book.models[g.index] = geometry.model(g.model)
            except KeyError:
                drift.append(f"GPU {g.index} is a {g.model!r}, which the geometry tables do not know")
            instances: Sequence[InstanceInfo] = ()
            spec = specs[g.index] if g.index < len(specs) else None
            if g.mig_enabled:
                instances = await self.backend.list_instances(g.index)
                if spec is not None and not spec.mig:
                    drift.append(f"GPU {g.index} is in MIG mode, configured not to be: it takes MIG jobs only")
            elif spec is None or spec.mig:
                drift.append(f"GPU {g.index} is not in MIG mode: it takes whole-GPU or time-sliced jobs only")
            replicas = spec.replicas if spec is not None and not g.mig_enabled else 0
            for info in instances:
                if not info.owned:
                    drift.append(
                        f"GPU {g.index} holds a foreign instance {info.profile}@{info.start} "
                        f"(GI {info.gi_id}): adopted, never destroyed"
                    )
            reports.append(
                GpuReport(
                    index=g.index,
                    uuid=g.uuid,
                    model=g.model,
                    mig_enabled=g.mig_enabled,
                    instances=tuple(self._report(i, running.get((g.index, i.gi_id))) for i in instances),
                    replicas=replicas,
                    jobs=() if g.mig_enabled else tuple(sorted(plain_jobs.get(g.index, ())))[:1024],
                )
            )
        expected = [g.model for g in specs] if self.backend.name != "sim" else []
        if expected and [g.model for g in gpus] != expected:
            drift.append(f"configured GPUs {expected} differ from the GPUs found {[g.model for g in gpus]}")
        if rec is not None:
            drift.extend(rec.notes)
        at = now()
        out = [
            Outgoing(
                self.subjects.node_report(self.node),
                Registered(
                    id=new_id("reg"), node=self.node, at=at, gpus=tuple(reports), backend=self.backend.name,
                    addr=self.addr, labels=self.labels,
                ),
            )
        ]
        if drift:
            out.append(
                Outgoing(
                    self.subjects.node_report(self.node),
                    Drift(id=new_id("drift"), node=self.node, at=at, details=tuple(drift[:64])),
                )
            )
        # jobs lost while the executor was down come out of backend.next_exit() as kind "lost": not here too
        await self.bus.publish_batch(out)
