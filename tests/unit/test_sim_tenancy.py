"""The simulator with tenants: preemption by priority class, quota holds, fair share, per-tenant KPIs."""

from __future__ import annotations

import math

from shared.mig.geometry import default_geometry
from shared.policy.request import Demand
from shared.sim.cluster import parse_cluster
from shared.sim.config import SimConfig
from shared.sim.jobs import SimJob, Workload
from shared.sim.tenancy import run_tenancy, synthetic_tenants, tenant_table
from shared.tenancy import parse_tenancy

GEO = default_geometry()
CLUSTER = parse_cluster(["A100-40GB:1"], GEO, 8)
CFG = SimConfig(patience_s=math.inf, checkpoint_s=0.0, reconfig_latency_s=0.0)
TENANCY = parse_tenancy(
    """
[priority_classes.low]
value = 10
preemption = "Never"
default = true

[priority_classes.high]
value = 900
preemption = "PreemptLowerPriority"

[tenants.serve]
priority_class = "low"

[tenants.train]
priority_class = "high"

[tenants.small]
quota = { compute_slices = 1 }
""",
    "test.toml",
    GEO,
)


def job(jid: str, at: float, dur: float, profile: str, tenant: str) -> SimJob:
    return SimJob(
        id=jid,
        arrival=at,
        duration=dur,
        demand=Demand(kind="mig", profile=profile),
        shape=profile.split(".")[0],
        tenant=tenant,
    )


def test_a_high_priority_job_preempts_low_priority_ones_which_rerun_and_lose_their_work() -> None:
    jobs = [job(f"s{n}", float(n), 1000.0, "1g.5gb", "serve") for n in range(7)]
    jobs.append(job("t1", 100.0, 50.0, "7g.40gb", "train"))
    r = run_tenancy(Workload(name="w", jobs=tuple(jobs)), CLUSTER, "paper-nomig", CFG, TENANCY)
    k = r.kpis
    assert k.completed == 8
    assert k.preemptions == 7
    assert k.tenants["serve"].preempted == 7
    assert k.tenants["train"].preempted == 0
    assert k.lost_work_s > 0  # no checkpoints: every victim restarts from scratch
    assert k.tenants["train"].wait_max_s == 0  # placed at once by preemption


def test_without_preemption_the_high_priority_job_waits() -> None:
    jobs = [job(f"s{n}", float(n), 1000.0, "1g.5gb", "serve") for n in range(7)]
    jobs.append(job("t1", 100.0, 50.0, "7g.40gb", "train"))
    r = run_tenancy(
        Workload(name="w", jobs=tuple(jobs)), CLUSTER, "paper-nomig", CFG, TENANCY, preempt=False
    )
    assert r.kpis.preemptions == 0
    assert r.kpis.tenants["train"].wait_max_s > 800


def test_a_tenant_over_its_quota_waits_for_quota_and_the_time_is_reported() -> None:
    jobs = [job("q1", 0.0, 100.0, "1g.5gb", "small"), job("q2", 1.0, 100.0, "1g.5gb", "small")]
    r = run_tenancy(Workload(name="w", jobs=tuple(jobs)), CLUSTER, "paper-nomig", CFG, TENANCY)
    t = r.kpis.tenants["small"]
    assert t.completed == 2
    assert t.quota_held_s == 99.0  # q2 waits until q1 ends at 100
    assert t.peak_slices == 1
    assert r.kpis.holds.get("quota", 0) >= 1
    assert "small" in tenant_table([r])


def test_synthetic_tenants_are_stable_and_classes_follow_the_old_tenant() -> None:
    w = Workload(name="w", jobs=tuple(job(f"j{n}", float(n), 1.0, "1g.5gb", "LS") for n in range(50)))
    a, classes = synthetic_tenants(w, ["x", "y", "z"])
    b, _ = synthetic_tenants(w, ["x", "y", "z"])
    assert [j.tenant for j in a.jobs] == [j.tenant for j in b.jobs]
    assert {j.tenant for j in a.jobs} == {"x", "y", "z"}
    assert set(classes.values()) == {"qos-ls"}
