"""The balancer's tenancy state: the tenancy file (hot-reloaded), the quota book, each running job's charge.

The book is a function of the mirror: at every full refresh it is rebuilt from the busy instances of the
shard (each carries its job's tenant; ``charges.instance_usage`` gives the charge), so it starts right after a
restart and cannot drift. Between refreshes it follows the balancer's own transitions: ``charge`` on a
committed reservation (the exact ``placement_usage``, also stored with the job in Redis), ``uncharge`` on the
job's exit or preemption — once, since the charge is popped. A partial reload of some GPUs re-derives the
charges of the jobs on them.

No tenancy file: ``active`` is False and the balancer places exactly as before (no quotas, no preemption).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from shared.errors import MigschedError
from shared.policy.charges import instance_usage
from shared.policy.priority import PriorityClass
from shared.policy.queue_order import PendingJob, QueueEntry, order
from shared.policy.quota import QuotaBook, QuotaError, charge, uncharge
from shared.policy.reserve import ReserveParams
from shared.policy.resources import EMPTY, GPU, SHARED, Usage
from shared.policy.shard_quota import QuotaLimit, shard_limits
from shared.policy.snapshot import ClusterSnapshot, GpuView
from shared.tenancy import Reload, Tenancy, TenancyWatcher

log = logging.getLogger("migsched.balancer")


class TenantLedger:
    """Tenancy configuration plus usage. Not thread-safe: the balancer calls it under its lock."""

    def __init__(self, path: str, reserve_full: int, poll_s: float = 2.0, geometry: Any = None) -> None:
        self.path = path
        self.active = bool(path)
        # a bad file fails start-up (TenancyError): a scheduler must not run without its quotas
        self.watcher = TenancyWatcher(path, time.monotonic, poll_s, geometry) if path else None
        self.tenancy: Tenancy = self.watcher.current if self.watcher else Tenancy(source="(none)")
        self.book = QuotaBook(self.tenancy.quotas)
        self.reserve = ReserveParams(reserve_full=reserve_full)
        # job -> gpu id -> (tenant, the charge of its instance there): a gang has one entry per GPU
        self.charges: dict[str, dict[str, tuple[str, Usage]]] = {}
        self.preemptions = 0
        self.shard_of: Callable[[str], int] = lambda gpu_id: 0
        """The shard a GPU lives in (the service sets it when there are several)."""
        self.in_shard: dict[int, dict[str, Usage]] = {}
        """Per shard, each tenant's charges there: what a reservation's ``limits`` leave out as used elsewhere."""

    # --- configuration --------------------------------------------------------------------------------------
    def poll(self) -> Reload | None:
        """Hot reload: a valid edit replaces the configuration (usage kept); an invalid one is logged and the
        previous configuration stays in force."""
        if self.watcher is None:
            return None
        r = self.watcher.poll()
        if r is None:
            return None
        if r.ok:
            self.tenancy = self.watcher.current
            self.book = self.book.with_policy(self.tenancy.quotas)
            log.info("tenancy file %s reloaded: %s", self.path, r.diff)
        else:
            log.error("tenancy file %s not reloaded (previous configuration kept): %s", self.path, r.error)
        return r

    def class_name(self, sub: Any) -> str:
        """The class ``sub`` runs in, for metrics: its own, or its tenant's default under a tenancy file."""
        if not self.active:
            return str(sub.priority_class or "default")
        try:
            return self.job_priority(sub.tenant, sub.priority_class, sub.priority)[0].name
        except MigschedError:  # an unknown class: the job is rejected; count it under the name it gave
            return str(sub.priority_class or "default")

    def job_priority(self, tenant: str, class_name: str | None, explicit: int) -> tuple[PriorityClass, int]:
        """The job's class and priority; raises UnknownPriorityClassError (a request error)."""
        return self.tenancy.job_priority(tenant, class_name, explicit)

    # --- usage ----------------------------------------------------------------------------------------------
    def rebuild(self, snaps: Iterable[ClusterSnapshot]) -> None:
        """Usage from scratch: every job-holding instance of the mirror, charged to its tenant."""
        self.charges = {}
        self.in_shard = {}
        totals: dict[str, Usage] = {}
        for snap in snaps:
            for g in snap.gpus:
                for job, tenant, usage in _held(snap, g):
                    if self._book_slot(job, g.id, tenant, usage):
                        totals[tenant] = totals.get(tenant, Usage()) + usage
        self.book = QuotaBook(self.tenancy.quotas, totals)

    def usage(self) -> dict[str, Usage]:
        """Each tenant's charge, summed over the jobs it runs (what the book holds)."""
        totals: dict[str, Usage] = {}
        for held in self.charges.values():
            for tenant, usage in held.values():
                totals[tenant] = totals.get(tenant, Usage()) + usage
        return totals

    def _book_slot(self, job: str, gpu_id: str, tenant: str, usage: Usage) -> bool:
        """Record one instance's charge; False when the job is charged there (or, for a job on a MIG instance,
        anywhere: a moving job's target is not a second charge) already."""
        held = self.charges.setdefault(job, {})
        if gpu_id in held:
            return False
        if held and not usage.get(GPU) and not usage.get(SHARED):
            return False
        held[gpu_id] = (tenant, usage)
        self._count(gpu_id, tenant, usage, True)
        return True

    def _count(self, gpu_id: str, tenant: str, usage: Usage, added: bool) -> None:
        """Follow a charge (``added``) or its return in the shard of ``gpu_id``."""
        by_tenant = self.in_shard.setdefault(self.shard_of(gpu_id), {})
        had = by_tenant.get(tenant, EMPTY)
        by_tenant[tenant] = had + usage if added else had - usage

    def reloaded(self, snap: ClusterSnapshot, gpu_ids: Iterable[str]) -> None:
        """Some GPUs were re-read: re-derive the charges held on them (one entry per GPU, so a gang's other
        GPUs keep theirs)."""
        ids = set(gpu_ids)
        for job, held in list(self.charges.items()):
            for gid in ids & held.keys():
                tenant, usage = held.pop(gid)
                self._give_back(gid, tenant, usage)
            if not held:
                del self.charges[job]
        for gid in ids:
            if gid in snap.position:
                for job, tenant, usage in _held(snap, snap.gpus[snap.position[gid]]):
                    if self._book_slot(job, gid, tenant, usage):
                        self.book = charge(self.book, tenant, usage)

    def charge(self, job: str, tenant: str, usages: Mapping[str, Mapping[str, float]]) -> bool:
        """Book the job's charge, per GPU it holds (``charges.slot_usages``); False (nothing done) when it is
        booked already."""
        if job in self.charges:
            return False
        self.charges[job] = {gid: (tenant, Usage(u)) for gid, u in usages.items()}
        for gid, (_, u) in self.charges[job].items():
            self.book = charge(self.book, tenant, u)
            self._count(gid, tenant, u, True)
        return True

    def uncharge(self, job: str) -> bool:
        """The job left its instances (exit, preemption): give its charge back, once."""
        held = self.charges.pop(job, None)
        if held is None:
            return False
        for gid, (tenant, usage) in held.items():
            self._give_back(gid, tenant, usage)
        return True

    def _give_back(self, gpu_id: str, tenant: str, usage: Usage) -> None:
        self._count(gpu_id, tenant, usage, False)
        try:
            self.book = uncharge(self.book, tenant, usage)
        except QuotaError as exc:  # cannot happen while the charges sum to the book; never go negative
            log.error("quota book out of step (%s); rebuilt at the next refresh", exc)

    def limits(self, tenant: str, usage: Mapping[str, float], shard: int) -> tuple[QuotaLimit, ...]:
        """The tenant's quota on the resources of ``usage`` as shard ``shard``'s ``reserve`` checks it, against
        its own usage counters (``shard_quota.shard_limits``); what the tenant and its cohort use in other shards, as
        this book knows it, is taken off. Nothing without a tenancy file."""
        if not self.active:
            return ()
        here = self.in_shard.get(shard, {})

        def elsewhere(t: str, resource: str) -> float:
            return max(0.0, self.book.used(t).amount(resource) - here.get(t, EMPTY).amount(resource))

        return shard_limits(self.book.policy, tenant, usage, elsewhere)

    # --- queue ----------------------------------------------------------------------------------------------
    def order(self, pending: Iterable[PendingJob], capacity: Mapping[str, float]) -> list[QueueEntry]:
        return order(pending, self.book, capacity)


def _held(snap: ClusterSnapshot, g: GpuView) -> Iterable[tuple[str, str, Usage]]:
    model = snap.geometry.model(g.model)
    for inst in g.instances:
        if inst.job_id and inst.job_id != "~retiring" and inst.tenant:
            yield inst.job_id, inst.tenant, instance_usage(g, model, inst)
