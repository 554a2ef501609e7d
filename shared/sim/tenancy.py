"""Tenants in the simulator: quotas, priority classes, fair-share queue order and preemption, with the same
pure policies as the balancer service (``admission.decide``, ``queue_order.order``; docs/operations.md, Tenancy §7).

``TenantSimulator`` is the engine with three things replaced: the queue pass (``order`` by priority, then
dominant-resource fair share between tenants, then age; ``decide`` per job: quota -> place behind the reserve
-> preempt), job exits (the job's stored charge is given back) and the report (per-tenant wait percentiles,
time held for quota, usage and borrowing over time, preemptions and lost work).

A preempted job loses its progress since its last checkpoint (``checkpoint_s``; all of it with 0), goes back
to the queue with its original arrival time (it keeps its age) and is counted in ``preemptions``.

``synthetic_tenants`` gives tenants to a trace: each job goes to one of ``teams`` by a stable hash of
its id, and its class is named after its old tenant (openb: the QoS), lower case, e.g. ``qos-ls``.
"""

from __future__ import annotations

import bisect
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import numpy as np

from shared.mig.geometry import Geometry, default_geometry
from shared.policy.admission import Hold, Start, decide
from shared.policy.charges import capacity_of, request_usages
from shared.policy.placement.balancer import BalancerParams
from shared.policy.preemption import Victim
from shared.policy.priority import PriorityClass
from shared.policy.queue_order import PendingJob, order
from shared.policy.quota import QuotaBook, charge, uncharge
from shared.policy.reserve import ReserveParams
from shared.policy.resources import COMPUTE, MEMORY, Usage
from shared.sim import events as ev
from shared.sim import reserving
from shared.sim.cluster import ClusterSpec
from shared.sim.config import SimConfig
from shared.sim.engine import Simulator
from shared.sim.errors import UnsupportedRunError
from shared.sim.jobs import QUEUED, RUNNING, STARTING, SimJob, Workload
from shared.sim.metrics import RunResult, TenantKpis
from shared.sim.run import Spec
from shared.tenancy import Tenancy


def synthetic_tenants(workload: Workload, teams: Sequence[str]) -> tuple[Workload, dict[str, str]]:
    """Jobs spread over ``teams`` by crc32 of the job id; class per job ``qos-<old tenant>``."""
    classes: dict[str, str] = {}
    jobs = []
    for j in workload.jobs:
        classes[j.id] = f"qos-{j.tenant.lower()}"
        team = teams[zlib.crc32(j.id.encode()) % len(teams)]
        jobs.append(msgspec.structs.replace(j, tenant=team))
    return msgspec.structs.replace(workload, jobs=tuple(jobs)), classes


class TenantSimulator(Simulator):
    """The engine with quotas, priority classes and preemption (see the module doc)."""

    def __init__(
        self,
        workload: Workload,
        cluster: ClusterSpec,
        spec: Spec,
        policy: Any,
        config: SimConfig | None = None,
        *,
        tenancy: Tenancy,
        classes: Mapping[str, str] | None = None,
        reserve_full: int = 0,
        preempt: bool = True,
        **kw: Any,
    ) -> None:
        classes = classes or {}
        klass: list[PriorityClass] = []
        jobs: list[SimJob] = []
        for j in workload.jobs:  # the queue keys and the instances carry the class's value
            k, prio = tenancy.job_priority(j.tenant, classes.get(j.id), j.priority)
            klass.append(k)
            jobs.append(j if prio == j.priority else msgspec.structs.replace(j, priority=prio))
        super().__init__(
            msgspec.structs.replace(workload, jobs=tuple(jobs)), cluster, spec, policy, config, **kw
        )
        self.tenancy, self.klass = tenancy, klass
        self.book = QuotaBook(tenancy.quotas)
        self.reserve = ReserveParams(reserve_full=reserve_full)
        self.preempt = preempt
        self.params = BalancerParams(threshold=self.cfg.threshold, top_k=0)
        n = len(self.jobs)
        self.charged: dict[int, Usage] = {}
        self.preempted = [0] * n
        self.lost_work = [0.0] * n
        self.quota_since = [math.nan] * n
        self.quota_held = [0.0] * n
        self.holds: dict[str, int] = {}
        self._usages: dict[Any, tuple[Usage, ...]] = {}
        self._memo: dict[tuple[Any, ...], int] = {}
        self._t_book = self.now
        self._area: dict[str, list[float]] = {}  # tenant -> [slice-s, GiB-s, borrowed slice-s, peak slices]

    # the queue pass -----
    def _schedule(self) -> None:
        """``order`` the head of the queue, then ``decide`` each job in that order; with a policy that reserves,
        a large job held for capacity gets the GPUs that free soonest (``reserving.PassHolds``), which the jobs
        after it in the pass may use only as ``may_use`` allows."""
        reserving.account(self)
        holds = reserving.PassHolds(self)
        if not self.queue:
            holds.settle()
            return
        snap = self.cluster.snapshot()
        head = [k[2] for k in self.queue[: self.cfg.backfill_depth]]
        pending = [
            PendingJob(
                job_id=str(i),
                tenant=self.jobs[i].tenant,
                priority=self.jobs[i].priority,
                submitted_at=self.jobs[i].arrival,
                usages=self._request(snap, i),
            )
            for i in head
        ]
        for entry in order(pending, self.book, capacity_of(snap)):
            i = int(entry.job.job_id)
            if self.state[i] != QUEUED:
                continue
            if entry.status == "quota":
                self._hold(i, "quota")
                continue
            d = self._admit(i, holds)
            if isinstance(d, Start):
                if self._evict(d, i):
                    self._start(i, d)
                    continue
                self._hold(i, "capacity")
            elif d is not None and (d.reason != "capacity" or d.deferred):
                continue  # over quota, or the policy keeps it waiting: no hold
            if self.reserves:
                holds.consider(i)
        holds.settle()

    def _admit(self, i: int, holds: reserving.PassHolds) -> Start | Hold | None:
        """``decide`` for queued job ``i``, the GPUs held for jobs before it hidden unless its hint lets it use
        them; None when it failed on capacity since room was last freed, with the same GPUs hidden (not asked
        again)."""
        job, now = self.jobs[i], self.now
        hint = self.hint(i)
        blocked = holds.blocking(hint)
        memo = (job.demand.label(), job.gpus, job.priority, job.tenant)
        remember = not blocked and i not in self.long_gangs  # a long gang's fit depends on the clock too
        if remember and self._memo.get(memo) == self.version:
            return None
        snap = self.cluster.snapshot()
        d = decide(
            snap.without(blocked) if blocked else snap,
            self.book,
            job.request(hint, now, self.blocks),
            self.klass[i],
            now,
            balancer=self.params,
            reserve=self.reserve,
            preempt=self.preempt,
            placer=self.policy,
        )
        if isinstance(d, Hold):
            self._hold(i, d.reason)
            if d.reason != "quota" and remember:
                self._memo[memo] = self.version
        return d

    def _start(self, i: int, d: Start) -> None:
        job = self.jobs[i]
        self._end_hold(i)
        self._book_tick()
        self.book = charge(self.book, job.tenant, d.usage)
        self.charged[i] = Usage(d.usage)
        self._remove_queued(i)
        self.start(i, d.placement.slots)

    def _request(self, snap: Any, i: int) -> tuple[Usage, ...]:
        demand = self.jobs[i].demand
        got = self._usages.get(demand)
        if got is None:
            got = self._usages[demand] = request_usages(snap, demand)
        return got

    def _remove_queued(self, i: int) -> None:
        j = self.jobs[i]
        key = (-j.priority, j.arrival, i)
        k = bisect.bisect_left(self.queue, key)
        if k < len(self.queue) and self.queue[k] == key:
            del self.queue[k]

    # preemption -----
    def _evict(self, d: Start, job: int) -> bool:
        """Preempt ``d.victims`` (all or none): False when one of them is moving (its state is in flux)."""
        idx = [self.index[v.job_id] for v in d.victims]
        if any(self.moving[i] is not None or self.state[i] not in (RUNNING, STARTING) for i in idx):
            return False
        for v, i in zip(d.victims, idx, strict=True):
            self._preempt(i, v)
        return True

    def _preempt(self, i: int, v: Victim) -> None:
        if self.state[i] == RUNNING:
            self.advance(i)
            done = self.jobs[i].duration + self.out.lost[i] - self.work[i]
            ckpt = self.cfg.checkpoint_s
            lost = done % ckpt if ckpt > 0 else done
            self.work[i] += lost
            self.out.lost[i] += lost
            self.lost_work[i] += lost
        for iid in self.insts[i]:  # released, not retained: the preemptor's slot reuses or destroys them
            gid = self.cluster.where[iid]
            self.leave(i, gid)
            self.cluster.release(iid)
            self.freed.append(gid)
        self.insts[i] = ()
        self.epoch[i] += 1  # its pending exit or reconfiguration event is stale now
        self.speed[i] = 1.0
        self.state[i] = QUEUED
        self.preempted[i] += 1
        self._uncharge(i)
        j = self.jobs[i]
        bisect.insort(self.queue, (-j.priority, j.arrival, i))

    # exits and usage -----
    def _on_exit(self, e: ev.Event) -> bool:
        if self.state[e.job] == RUNNING and self.epoch[e.job] == e.epoch:
            self._uncharge(e.job)  # before the queue pass the exit triggers
        return super()._on_exit(e)

    def _on_timeout(self, e: ev.Event) -> bool:
        if self.preempted[e.job]:
            return False  # as in the service: a preempted job does not run out of patience
        if self.state[e.job] == QUEUED:
            self._end_hold(e.job)
        return super()._on_timeout(e)

    def _uncharge(self, i: int) -> None:
        u = self.charged.pop(i, None)
        if u is not None:
            self._book_tick()
            self.book = uncharge(self.book, self.jobs[i].tenant, u)

    def _book_tick(self) -> None:
        """Integrate each tenant's usage and borrowing since the last change of the book."""
        dt = self.now - self._t_book
        self._t_book = self.now
        for t, u in self.book.usage.items():
            a = self._area.setdefault(t, [0.0, 0.0, 0.0, 0.0])
            a[0] += dt * u.amount(COMPUTE)
            a[1] += dt * u.amount(MEMORY)
            a[2] += dt * self.book.borrowed(t).amount(COMPUTE)
            a[3] = max(a[3], u.amount(COMPUTE))

    def _hold(self, i: int, reason: str) -> None:
        self.holds[reason] = self.holds.get(reason, 0) + 1
        if reason == "quota":
            if math.isnan(self.quota_since[i]):
                self.quota_since[i] = self.now
        else:
            self._end_hold(i)

    def _end_hold(self, i: int) -> None:
        if not math.isnan(self.quota_since[i]):
            self.quota_held[i] += self.now - self.quota_since[i]
            self.quota_since[i] = math.nan

    # the report -----
    def run(self) -> RunResult:
        result = super().run()
        self._book_tick()
        return msgspec.structs.replace(result, kpis=self.kpis(result.kpis))

    def kpis(self, k: Any) -> Any:
        start = np.array(self.out.start, dtype=np.float64)
        arrival = np.array([j.arrival for j in self.jobs], dtype=np.float64)
        tenants: dict[str, TenantKpis] = {}
        for t, base in k.tenants.items():
            sel = np.array([j.tenant == t for j in self.jobs], dtype=bool)
            waits = (start - arrival)[sel & ~np.isnan(start)]
            a = self._area.get(t, [0.0, 0.0, 0.0, 0.0])
            tenants[t] = msgspec.structs.replace(
                base,
                wait_p50_s=_r(float(np.percentile(waits, 50)) if waits.size else 0.0),
                wait_p95_s=_r(float(np.percentile(waits, 95)) if waits.size else 0.0),
                wait_max_s=_r(float(waits.max()) if waits.size else 0.0),
                quota_held_s=_r(sum(h for h, s in zip(self.quota_held, sel, strict=True) if s)),
                preempted=int(sum(p for p, s in zip(self.preempted, sel, strict=True) if s)),
                lost_work_s=_r(sum(x for x, s in zip(self.lost_work, sel, strict=True) if s)),
                book_slice_h=_r(a[0] / 3600.0),
                book_gib_h=_r(a[1] / 3600.0),
                borrowed_slice_h=_r(a[2] / 3600.0),
                peak_slices=_r(a[3]),
            )
        return msgspec.structs.replace(
            k,
            tenants=tenants,
            preemptions=int(sum(self.preempted)),
            lost_work_s=_r(sum(self.lost_work)),
            holds=dict(sorted(self.holds.items())),
        )


def _r(x: float) -> float:
    return round(float(x), 3)


def run_tenancy(
    workload: Workload,
    cluster: ClusterSpec,
    name: str,
    cfg: SimConfig,
    tenancy: Tenancy,
    *,
    classes: Mapping[str, str] | None = None,
    reserve_full: int = 0,
    preempt: bool = True,
    geometry: Geometry | None = None,
    label: str | None = None,
) -> RunResult:
    """One run of policy ``name`` (a label, parameters included) with tenancy: its placement behind quota and
    the reserve, then preemption, and its reservations when it reserves, as in the service. Policies that
    repartition only (not the static layouts). The KPIs are named ``label``, else ``name``."""
    from shared.policy.placement.registry import get_policy, parse_label
    from shared.sim.experiment import policy_params

    base, params = parse_label(name)
    spec, policy = get_policy(base, **{**policy_params(base, workload, cfg), **params})
    if not spec.repartitions:
        raise UnsupportedRunError(f"tenancy runs need a policy that repartitions GPUs, not {name} (a static layout)")
    sim = TenantSimulator(
        workload,
        cluster,
        spec,
        policy,
        cfg,
        tenancy=tenancy,
        classes=classes,
        reserve_full=reserve_full,
        preempt=preempt,
        geometry=geometry or default_geometry(),
    )
    result = sim.run()
    return msgspec.structs.replace(result, kpis=msgspec.structs.replace(result.kpis, policy=label or name))


def tenant_table(results: Sequence[RunResult]) -> str:
    """Markdown: one row per (run, tenant) with wait, quota holds, usage, borrowing and preemptions."""
    rows = [
        "| policy | tenant | jobs | completed | rejected | wait mean s | p50 | p95 | max | quota held h | "
        "usage slice-h | borrowed slice-h | peak slices | preempted | lost work h |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in results:
        k = r.kpis
        for t, x in k.tenants.items():
            rows.append(
                f"| {k.policy} | {t} | {x.jobs} | {x.completed} | {x.rejected} | {x.wait_mean_s:.0f} | "
                f"{x.wait_p50_s:.0f} | {x.wait_p95_s:.0f} | {x.wait_max_s:.0f} | "
                f"{x.quota_held_s / 3600:.1f} | "
                f"{x.book_slice_h:.0f} | {x.borrowed_slice_h:.0f} | {x.peak_slices:.0f} | {x.preempted} | "
                f"{x.lost_work_s / 3600:.1f} |"
            )
        rows.append(
            f"| {k.policy} | **all** | {k.jobs} | {k.completed} | {k.rejected} | {k.wait_mean_s:.0f} | | "
            f"{k.wait_p95_s:.0f} | | | | | | {k.preemptions} | {k.lost_work_s / 3600:.1f} |"
        )
    return "\n".join(rows)
