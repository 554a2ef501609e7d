"""The balancer's gauges say what the mirror, the quota book and the queue hold, and drop series that are gone."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from services.balancer import metrics as m
from services.balancer.tenancy import TenantLedger
from shared.events import JobSubmit
from shared.mig.geometry import default_geometry
from shared.mig.tables import tables_for
from shared.policy.fragcost import UNIFORM_SHAPES, frag_rate
from shared.policy.gpu_view import GpuView, InstanceView
from shared.policy.quota import QuotaPolicy, TenantQuota
from shared.policy.request import mig
from shared.policy.resources import Usage
from shared.policy.snapshot import snapshot_of

pytestmark = pytest.mark.unit
GEO = default_geometry()
A100 = GEO.model("A100-40GB")


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def inst(profile: str, start: int, job: str | None) -> InstanceView:
    p = A100.profile(profile)
    return InstanceView(id=f"{profile}@{start}", profile=profile, start=start, size=p.memory_slices,
                        compute=p.compute_slices, job_id=job)


def test_each_gpu_reports_its_busy_idle_and_free_slices_and_its_fragcost() -> None:
    gpus = [
        GpuView.build(id="a/0", node="a", index=0, model=A100.name,
                      instances=(inst("3g.20gb", 4, "j1"), inst("1g.5gb", 0, None))),
        GpuView.build(id="a/1", node="a", index=1, model=A100.name),
        GpuView.build(id="b/0", node="b", index=0, model=A100.name, instances=(inst("1g.5gb", 6, "j2"),)),
    ]
    snap = snapshot_of(GEO, gpus)
    m.cluster([snap])
    assert [value("migsched_gpu_memory_slices", node="a", gpu="a/0", state=s) for s in ("busy", "idle", "free")] \
        == [4.0, 1.0, 3.0]
    assert value("migsched_gpu_memory_slices", node="a", gpu="a/1", state="free") == 8.0
    assert value("migsched_gpu_fragcost", node="b", gpu="b/0") == pytest.approx(
        tables_for(A100).cost(snap.gpus[2].busy_mask))
    assert value("migsched_fragmentation_rate") == pytest.approx(frag_rate(snap, UNIFORM_SHAPES))
    only_b = snapshot_of(GEO, gpus[2:])
    assert value("migsched_node_fragmentation_rate", node="b") == pytest.approx(frag_rate(only_b, UNIFORM_SHAPES))
    m.cluster([snapshot_of(GEO, gpus[:2])])  # node b left the cluster: its series go
    assert value("migsched_node_fragmentation_rate", node="b") is None
    assert value("migsched_gpu_fragcost", node="b", gpu="b/0") is None


def test_each_tenant_reports_what_it_holds_against_its_nominal_quota_and_what_it_borrows() -> None:
    policy = QuotaPolicy([
        TenantQuota(name="team-a", cohort="c", quota={"compute_slices": 7}, borrowing_limit={"compute_slices": 7}),
        TenantQuota(name="team-b", quota={"memory_gib": 40}),
    ])
    m.tenants({"team-a": Usage({"compute_slices": 10.0}), "team-b": Usage({"memory_gib": 5.0})}, policy)
    assert value("migsched_tenant_allocated", tenant="team-a", resource="compute_slices") == 10.0
    assert value("migsched_tenant_quota", tenant="team-a", resource="compute_slices", kind="nominal") == 7.0
    assert value("migsched_tenant_quota", tenant="team-a", resource="compute_slices", kind="borrowing_limit") == 7.0
    assert value("migsched_tenant_borrowed", tenant="team-a", resource="compute_slices") == 3.0
    assert value("migsched_tenant_borrowed", tenant="team-b", resource="memory_gib") == 0.0
    m.tenants({}, policy)
    assert value("migsched_tenant_allocated", tenant="team-a", resource="compute_slices") is None


def submit(job: str, tenant: str, at: float, klass: str | None = None) -> JobSubmit:
    return JobSubmit(id=job, job_id=job, tenant=tenant, demand=mig("1g.5gb"), submitted_at=at, priority_class=klass)


def test_the_queue_is_counted_per_tenant_and_class_with_each_tenants_oldest_wait() -> None:
    pending = [submit("1", "team-a", 100.0), submit("2", "team-a", 400.0, "batch"), submit("3", "team-a", 700.0),
               submit("4", "team-b", 900.0)]
    m.queue(pending, 9, now=1000.0)
    assert value("migsched_pending_jobs", tenant="team-a", priority_class="default") == 2.0
    assert value("migsched_pending_jobs", tenant="team-a", priority_class="batch") == 1.0
    assert value("migsched_pending_oldest_age_seconds", tenant="team-a") == 900.0
    assert value("migsched_pending_oldest_age_seconds", tenant="team-b") == 100.0
    assert value("migsched_queue_depth") == 9.0
    m.queue(pending[3:], 1, now=1000.0)
    assert value("migsched_pending_jobs", tenant="team-a", priority_class="default") is None


def test_a_placement_records_the_wait_per_tenant_and_class() -> None:
    before = value("migsched_admission_wait_seconds_count", tenant="team-w", priority_class="default") or 0.0
    m.placed(submit("5", "team-w", 10.0), now=130.0)
    assert value("migsched_admission_wait_seconds_count", tenant="team-w", priority_class="default") == before + 1
    assert value("migsched_admission_wait_seconds_bucket", tenant="team-w", priority_class="default",
                 le="60.0") == 0.0
    assert value("migsched_admission_wait_seconds_bucket", tenant="team-w", priority_class="default",
                 le="300.0") == before + 1


def test_a_jobs_class_is_its_tenants_default_under_a_tenancy_file(tmp_path: Path) -> None:
    f = tmp_path / "tenancy.toml"
    f.write_text('[priority_classes.inference-low]\nvalue = 100\n\n[priority_classes.training-high]\nvalue = 1000\n\n'
                 '[tenants.team-a]\npriority_class = "inference-low"\n')
    ledger = TenantLedger(str(f), reserve_full=0)
    assert ledger.class_name(submit("1", "team-a", 1.0)) == "inference-low"
    assert ledger.class_name(submit("2", "team-a", 1.0, "training-high")) == "training-high"
    assert ledger.class_name(submit("3", "team-a", 1.0, "no-such-class")) == "no-such-class"
    assert TenantLedger("", reserve_full=0).class_name(submit("4", "team-b", 1.0)) == "default"
    m.queue([submit("5", "team-a", 1.0)], 1, now=2.0, class_of=ledger.class_name)
    assert value("migsched_pending_jobs", tenant="team-a", priority_class="inference-low") == 1.0
