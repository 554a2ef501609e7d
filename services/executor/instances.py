"""The executor's map from migsched instance ids to the backend's GPU instances, and MIG op application.

The backend knows GPU instances by ``(gpu_index, gi_id)``; the scheduler names them by a migsched instance id.
An instance is also uniquely identified by its placement: at most one GI can start at a given memory slice on
one GPU. So every op is resolved against what the GPU holds *now* (``list_instances``), not against what this
process remembers: a command replayed after a crash (or an ack lost in flight) finds its instance already
created and skips the op, and a destroy finds it already gone. That is what makes a replayed command harmless.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from services.executor import nvml_codes
from services.executor.backend import Backend, InstanceInfo
from services.executor.nvml_errors import error_for_code
from shared.events import InstanceReport
from shared.mig.geometry import Geometry, GpuModel, default_geometry
from shared.policy.partition import MigOp

_PLACED_ID = re.compile(r"^[^:]+:(?P<profile>[^:@]+)@(?P<start>\d+):")
"""``shared.policy.partition.new_instance_id`` names instances ``<gpu_id>:<profile>@<start>:<nonce>``; a GPU
id (``node/index``) has no colon, the nonce (a job id) may."""


class InstanceBook:
    """migsched instance id -> backend instance, resolved by placement when this process has not seen it."""

    def __init__(
        self, backend: Backend, models: dict[int, GpuModel], geometry: Geometry | None = None
    ) -> None:
        self.backend = backend
        self.models = models
        self.geometry = geometry or default_geometry()
        self._known: dict[str, InstanceInfo] = {}
        self._names: dict[tuple[int, int], str] = {}

    def name_of(self, info: InstanceInfo) -> str | None:
        return self._names.get((info.gpu_index, info.gi_id))

    def _remember(self, instance_id: str, info: InstanceInfo) -> InstanceInfo:
        self._known[instance_id] = info
        self._names[(info.gpu_index, info.gi_id)] = instance_id
        return info

    def _forget(self, instance_id: str) -> None:
        info = self._known.pop(instance_id, None)
        key = None if info is None else (info.gpu_index, info.gi_id)
        # GI ids are reused: the GI this name stood for may carry another instance's name now, which stays
        if key is not None and self._names.get(key) == instance_id:
            del self._names[key]

    async def at(self, gpu_index: int, start: int, profile_id: int | None) -> InstanceInfo | None:
        """The GI that exists now at ``start`` on the GPU (of ``profile_id`` when given)."""
        for info in await self.backend.list_instances(gpu_index):
            if info.start == start and (profile_id is None or info.profile_id == profile_id):
                return info
        return None

    async def find(self, gpu_index: int, instance_id: str) -> InstanceInfo | None:
        """The instance named ``instance_id``: remembered, or located by the placement its id encodes."""
        info = self._known.get(instance_id)
        if info is not None:
            current = await self.at(info.gpu_index, info.start, info.profile_id)
            if current is not None and current.gi_id == info.gi_id:
                return current
            self._forget(instance_id)
        m = _PLACED_ID.match(instance_id)
        model = self.models.get(gpu_index)
        if m is None or model is None or not model.has_profile(m["profile"]):
            return None
        found = await self.at(gpu_index, int(m["start"]), model.profile(m["profile"]).profile_id)
        return None if found is None else self._remember(instance_id, found)

    async def apply(
        self,
        gpu_index: int,
        ops: Sequence[MigOp],
        busy: set[tuple[int, int]],
        created: list[InstanceInfo] | None = None,
    ) -> int:
        """Apply ``ops`` in order, skipping any already done; returns the GPU instances created or destroyed.

        ``busy`` holds the ``(gpu_index, gi_id)`` of instances with a running workload: destroying one is
        refused (the plan was made from a stale view), never forced. Instances created are appended to
        ``created``.
        """
        changed = 0
        for op in ops:
            if op.kind == "destroy_ci":
                continue  # the backend destroys the compute instance together with its GI (destroy_gi)
            current = await self.at(gpu_index, op.start, op.profile_id)
            if op.kind == "destroy_gi":
                if current is None:
                    self._forget(op.instance_id)
                    continue
                if (gpu_index, current.gi_id) in busy:
                    raise error_for_code(
                        nvml_codes.IN_USE,
                        f"destroy {op.profile}@{op.start} on GPU "
                        f"{gpu_index} ({op.instance_id}, a workload still runs on it)",
                    )
                await self.backend.destroy_instance(gpu_index, current.gi_id)
                self._forget(op.instance_id)
                changed += 1
            elif op.kind == "create_gi":
                if current is not None:
                    self._remember(op.instance_id, current)  # replayed command: it exists already
                    continue
                info = self._remember(
                    op.instance_id, await self.backend.create_instance(gpu_index, op.profile_id, op.start)
                )
                if created is not None:
                    created.append(info)
                changed += 1
            elif op.kind == "create_ci":
                if current is None:
                    raise error_for_code(
                        nvml_codes.NOT_FOUND,
                        f"create the compute instance of "
                        f"{op.instance_id} ({op.profile}@{op.start} on GPU {gpu_index})",
                    )
                self._remember(op.instance_id, current)
        return changed


def report(info: InstanceInfo, instance_id: str | None, job_id: str | None = None,
           started_by: str | None = None) -> InstanceReport:
    return InstanceReport(
        instance_id=instance_id,
        gi_id=info.gi_id,
        ci_id=info.ci_id,
        profile=info.profile,
        profile_id=info.profile_id,
        start=info.start,
        size=info.size,
        uuid=info.uuid,
        job_id=job_id,
        started_by=started_by if job_id is not None else None,
    )


def gpu_index_of(gpu_id: str | None) -> int | None:
    """``<node>/<index>`` (``shared.state.model.gpu_id_of``) -> index."""
    if not gpu_id or "/" not in gpu_id:
        return None
    tail = gpu_id.rsplit("/", 1)[1]
    return int(tail) if tail.isdigit() else None


async def undo(backend: Backend, book: InstanceBook, created: Sequence[InstanceInfo]) -> list[str]:
    """Destroy what a failed command created (the state store forgets a failed placement's or an aborted
    move's instance, so the GPU must too); returns what could not be undone."""
    left: list[str] = []
    for info in reversed(created):
        try:
            await backend.destroy_instance(info.gpu_index, info.gi_id)
        except Exception as exc:  # best effort: the failure report says what is left
            left.append(f"{info.profile}@{info.start} on GPU {info.gpu_index}: {exc}")
        else:
            name = book.name_of(info)
            if name is not None:
                book._forget(name)
    return left
