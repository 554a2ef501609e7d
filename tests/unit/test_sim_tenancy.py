"""The simulator with tenants: preemption by priority class, quota holds, fair share, per-tenant KPIs."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest

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


def _starving(tenant: str) -> Workload:
    """Two nodes of two GPUs; a 1g every 100 s for 1,000 s each keeps every GPU busy; a 2-GPU job arrives at
    t=350, when every GPU holds one, and waits at most 3,000 s (all of one tenant, so priority plays no part)."""
    jobs = [SimJob(id=f"s{k:03d}", arrival=100.0 * k, duration=1000.0, demand=Demand(kind="mig", profile="1g.5gb"),
                   shape="1g", tenant=tenant) for k in range(80)]
    jobs.append(SimJob(id="gang", arrival=350.0, duration=500.0, demand=Demand(kind="gpus", gpus=2), shape="7g",
                       tenant=tenant, patience=3000.0))
    return Workload(name="starving", jobs=tuple(sorted(jobs, key=lambda j: j.arrival)))


def test_with_tenancy_a_policy_that_reserves_holds_gpus_for_a_gang_that_small_jobs_would_starve() -> None:
    cluster = parse_cluster(["A100-40GB:4"], GEO, 2)
    cfg = SimConfig(patience_s=3000.0, reserve_after_s=0.0, check_invariants=True)
    held = run_tenancy(_starving("serve"), cluster, "spread[reserve=on]", cfg, TENANCY, preempt=False)
    greedy = run_tenancy(_starving("serve"), cluster, "spread", cfg, TENANCY, preempt=False)
    # the hold drains GPUs for the gang as small jobs end: it starts; without it the small jobs keep every GPU
    assert held.kpis.classes["2gpu"].rejected == 0 and held.kpis.reserved_idle_gpu_h > 0
    assert greedy.kpis.classes["2gpu"].rejected == 1
    for r in (held, greedy):
        assert r.kpis.completed + r.kpis.rejected == r.kpis.jobs


@pytest.mark.parametrize("name", ["migsched", "first-fit", "best-fit", "fgd", "spread", "paper"])
def test_with_tenancy_every_policy_that_repartitions_accounts_for_every_job_and_repeats_itself(name: str) -> None:
    from shared.sim.workloads.synthetic import synthetic

    wl, _ = synthetic_tenants(synthetic(np.random.default_rng(3), jobs=300, load=1.3, cluster_slices=8 * 7),
                              ["serve", "train"])
    cfg = SimConfig(patience_s=1800.0, check_invariants=True)
    runs = [run_tenancy(wl, parse_cluster(["A100-40GB:8"], GEO, 4), name, cfg, TENANCY) for _ in range(2)]
    k = runs[0].kpis
    assert k.completed + k.rejected == k.jobs == 300
    assert msgspec.structs.replace(k, wall_s=0.0) == msgspec.structs.replace(runs[1].kpis, wall_s=0.0)
