"""The immutable views of one GPU and its instances that every policy reads (``ClusterSnapshot`` holds them)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec

from shared.mig.occupancy import span


class InstanceView(msgspec.Struct, frozen=True, kw_only=True):
    """A created GPU instance (GI + CI); busy when a job runs on it, idle when kept for reuse."""

    id: str
    profile: str
    start: int
    size: int
    compute: int
    job_id: str | None = None
    migratable: bool = True
    latency_sensitive: bool = False
    priority: int = 0
    tenant: str = ""
    last_moved_at: float = -math.inf
    started_at: float = 0.0
    preemptible: bool = True
    """False when the job's priority class forbids preempting it (shared.policy.preemption never picks it)."""
    ends_at: float | None = None
    """When its job is expected to end (start + duration hint); None = unknown or idle."""

    @property
    def busy(self) -> bool:
        return self.job_id is not None

    @property
    def mask(self) -> int:
        return span(self.size, self.start)

    @property
    def expected_end(self) -> float:
        """``ends_at``, inf when unknown."""
        return math.inf if self.ends_at is None else self.ends_at


class GpuView(msgspec.Struct, frozen=True, kw_only=True, weakref=True):
    """One physical GPU: identity, model, mode and its instances, with derived occupancy. Weakly referable, so
    that a cache of what is derived from a view (``PlannerMemos.view_jobs``) lives no longer than it."""

    id: str
    node: str
    index: int
    model: str
    mig: bool = True
    healthy: bool = True
    replicas: int = 0
    instances: tuple[InstanceView, ...] = ()
    busy_mask: int = 0
    idle_mask: int = 0
    used_compute: int = 0

    @classmethod
    def build(
        cls,
        *,
        id: str,
        node: str,
        index: int,
        model: str,
        instances: Iterable[InstanceView] = (),
        mig: bool = True,
        healthy: bool = True,
        replicas: int = 0,
    ) -> GpuView:
        insts = tuple(sorted(instances, key=lambda i: (i.start, i.id)))
        busy = idle = used = 0
        for inst in insts:
            if inst.busy:
                busy |= inst.mask
                used += inst.compute
            else:
                idle |= inst.mask
        return cls(
            id=id, node=node, index=index, model=model, mig=mig, healthy=healthy, replicas=replicas,
            instances=insts, busy_mask=busy, idle_mask=idle, used_compute=used,
        )

    def with_instances(self, instances: Iterable[InstanceView]) -> GpuView:
        return GpuView.build(
            id=self.id, node=self.node, index=self.index, model=self.model, instances=instances,
            mig=self.mig, healthy=self.healthy, replicas=self.replicas,
        )

    def instance(self, instance_id: str) -> InstanceView | None:
        for inst in self.instances:
            if inst.id == instance_id:
                return inst
        return None

    def job_instance(self, job_id: str) -> InstanceView | None:
        for inst in self.instances:
            if inst.job_id == job_id:
                return inst
        return None
