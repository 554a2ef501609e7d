"""The balancer's Prometheus metrics: decisions and their latency, the queue per tenant and priority class, the
quota book, and the cluster's occupancy and fragmentation as its mirror sees it.

Named after the anchors operators know: Kueue's ``pending_workloads{cluster_queue}`` and
``admission_wait_time_seconds`` are ``migsched_pending_jobs{tenant,priority_class}`` and
``migsched_admission_wait_seconds``; KAI-Scheduler's ``queue_allocated_gpus`` and ``queue_fair_share_gpu`` are
``migsched_tenant_allocated{tenant,resource}`` and ``migsched_tenant_quota{tenant,resource,kind}``. The gauges
are set at start and then every ``MIGSCHED_MIRROR_REFRESH_S``; counters and histograms as things happen. Every
balancer replica exports the gauges (they agree): aggregate them with ``max``.
"""

from __future__ import annotations

import math
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping, Sequence

from prometheus_client import Counter, Gauge, Histogram

from services.common.metric_cache import child
from shared.events import JobSubmit
from shared.mig.tables import popcount_table, tables_for
from shared.policy.fragcost import UNIFORM_SHAPES, frag_by_gpu, rate_of
from shared.policy.quota import QuotaPolicy
from shared.policy.resources import Usage
from shared.policy.snapshot import ClusterSnapshot

WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400)
"""Seconds to a day: a job may wait for a whole GPU for hours."""

DECISIONS = Counter("migsched_decisions_total", "Scheduling decisions by outcome", ["outcome"])
DECISION_SECONDS = Histogram(
    "migsched_decision_seconds", "Policy time of one decision",
    buckets=(1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2),
)
SUBMIT_TO_COMMAND = Histogram(
    "migsched_submit_to_command_seconds", "From a job's submit to its place command being sent (queue wait "
    "included)", buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, *WAIT_BUCKETS[1:]),
)
ADMISSION_WAIT = Histogram(
    "migsched_admission_wait_seconds", "From a job's submit to its placement, per tenant and priority class",
    ["tenant", "priority_class"], buckets=WAIT_BUCKETS,
)
PLACEMENTS = Counter("migsched_placements_total", "Jobs placed, per tenant", ["tenant"])
PREEMPTIONS = Counter("migsched_preemptions_total", "Jobs preempted, per tenant of the victim", ["tenant"])
CONFLICTS = Counter("migsched_cas_conflicts_total", "Reservations that lost a compare-and-set race")
ROUTED = Counter("migsched_jobs_routed_total", "New jobs sent to a shard other than their home (crc32 of the id)",
                 ["reason"])
"""reason: ``never_fits`` (no set of the home's GPUs could host it), ``no_room_now`` (the home could not place it
then, another shard could), ``sooner_elsewhere`` (no shard could; a large job's GPUs are expected to free sooner in
another)."""
MISSED_SUBMITS = Counter(
    "migsched_balancer_missed_submits_total",
    "Submits the stream stored that the balancer's durable consumer skipped across a change of its leader, "
    "decided when read back",
)
QUEUE_DEPTH = Gauge("migsched_queue_depth", "Pending jobs, all tenants")
PENDING = Gauge("migsched_pending_jobs", "Pending jobs per tenant and priority class",
                ["tenant", "priority_class"])
OLDEST = Gauge("migsched_pending_oldest_age_seconds", "Age of the oldest pending job per tenant", ["tenant"])
ALLOCATED = Gauge("migsched_tenant_allocated", "What a tenant's running jobs hold, per quota resource "
                  "(compute_slices, memory_gib, nvidia.com/gpu, a MIG profile)", ["tenant", "resource"])
QUOTA = Gauge("migsched_tenant_quota", "A tenant's quota per resource: kind nominal (guaranteed) or "
              "borrowing_limit (how far above nominal it may borrow)", ["tenant", "resource", "kind"])
BORROWED = Gauge("migsched_tenant_borrowed", "What a tenant holds above its nominal quota", ["tenant", "resource"])
GPU_SLICES = Gauge("migsched_gpu_memory_slices", "A GPU's memory slices by state: busy (a job's), idle (an "
                   "instance without a job) or free", ["node", "gpu", "state"])
GPU_FRAGCOST = Gauge("migsched_gpu_fragcost", "A GPU's FragCost (its busy instances)", ["node", "gpu"])
NODE_FRAG = Gauge("migsched_node_fragmentation_rate", "Share of a node's free memory slices the demand mix "
                  "cannot use", ["node"])
FRAG_RATE = Gauge("migsched_fragmentation_rate", "Share of the cluster's free memory slices the demand mix "
                  "cannot use")


ClassOf = Callable[[JobSubmit], str]
"""The priority class a job runs in (with a tenancy file, the tenant's default when the job names none)."""


def named_class(sub: JobSubmit) -> str:
    return sub.priority_class or "default"


def placed(sub: JobSubmit, now: float, class_of: ClassOf = named_class) -> None:
    """A job was placed (its reservation committed) and its command is on its way."""
    wait = max(0.0, now - sub.submitted_at)
    child(ADMISSION_WAIT, sub.tenant, class_of(sub)).observe(wait)
    child(PLACEMENTS, sub.tenant).inc()
    SUBMIT_TO_COMMAND.observe(wait)


def queue(pending: Sequence[JobSubmit], depth: int, now: float, class_of: ClassOf = named_class) -> None:
    """The pending jobs: per tenant and class, the oldest per tenant, and how many in all."""
    QUEUE_DEPTH.set(depth)
    counts = Tally((s.tenant, class_of(s)) for s in pending)
    oldest: dict[str, float] = {}
    for s in pending:
        oldest[s.tenant] = max(oldest.get(s.tenant, 0.0), now - s.submitted_at)
    _replace(PENDING, {k: float(v) for k, v in counts.items()})
    _replace(OLDEST, {(t,): age for t, age in oldest.items()})


def tenants(usage: Mapping[str, Usage], policy: QuotaPolicy) -> None:
    """Each tenant's allocation against its quota."""
    held: dict[tuple[str, ...], float] = {(t, r): float(v) for t, u in usage.items() for r, v in u.items() if v}
    quota: dict[tuple[str, ...], float] = {}
    borrowed: dict[tuple[str, ...], float] = {}
    for name, q in policy.tenants.items():
        for r in q.quota:
            quota[(name, r, "nominal")] = q.nominal(r)
            borrowed[(name, r)] = max(0.0, held.get((name, r), 0.0) - q.nominal(r))
        for r in q.borrowing_limit or {}:
            if math.isfinite(q.borrow_cap(r)):
                quota[(name, r, "borrowing_limit")] = q.borrow_cap(r)
    _replace(ALLOCATED, held)
    _replace(QUOTA, quota)
    _replace(BORROWED, borrowed)


def cluster(snaps: Iterable[ClusterSnapshot]) -> None:
    """Occupancy and FragCost per GPU, fragmentation per node and for the cluster."""
    slices: dict[tuple[str, ...], float] = {}
    cost: dict[tuple[str, ...], float] = {}
    node_unusable: dict[str, float] = {}
    node_free: dict[str, float] = {}
    pop = popcount_table()
    for snap in snaps:
        if not len(snap):
            continue
        unusable, free = frag_by_gpu(snap, UNIFORM_SHAPES)
        for i, g in enumerate(snap.gpus):
            model = snap.geometry.model(g.model)
            busy, idle = int(pop[g.busy_mask]), int(pop[g.idle_mask])
            for state, n in (("busy", busy), ("idle", idle), ("free", model.memory_slices - busy - idle)):
                slices[(g.node, g.id, state)] = float(n)
            cost[(g.node, g.id)] = float(tables_for(model).cost(g.busy_mask)) if g.mig else 0.0
            node_unusable[g.node] = node_unusable.get(g.node, 0.0) + float(unusable[i])
            node_free[g.node] = node_free.get(g.node, 0.0) + float(free[i])
    _replace(GPU_SLICES, slices)
    _replace(GPU_FRAGCOST, cost)
    _replace(NODE_FRAG, {(n,): rate_of(node_unusable[n], f) for n, f in node_free.items()})
    FRAG_RATE.set(rate_of(sum(node_unusable.values()), sum(node_free.values())))


_SHOWN: dict[Gauge, set[tuple[str, ...]]] = {}
"""The label sets each gauge was last given."""


def _replace(gauge: Gauge, values: Mapping[tuple[str, ...], float]) -> None:
    """Set the gauge to exactly these series: one that is gone (a tenant with nothing pending, a removed GPU)
    is dropped rather than left at its last value. The others are overwritten in place, so that a scrape in
    between never sees them missing."""
    for labels, v in values.items():
        gauge.labels(*labels).set(v)
    for labels in _SHOWN.get(gauge, set()) - values.keys():
        gauge.remove(*labels)
    _SHOWN[gauge] = set(values)
