"""The issue's end-to-end stories, played through the pure policies with a tiny in-test cluster state.

Preemption on a full cluster and re-queue of the victims; a tenant over quota waits and starts when its usage
drops; borrowing across a cohort and reclaim by the lender. The live stack and the simulator wire the same
``admission.decide`` calls (docs/operations.md, Tenancy).
"""

from __future__ import annotations

import msgspec
import pytest

from shared.mig.geometry import default_geometry
from shared.policy.admission import Hold, Start, decide
from shared.policy.placement.decision import JobRequest
from shared.policy.placement.sharing import SHARE_PROFILE, WHOLE_PROFILE, instance_for_slot
from shared.policy.priority import PriorityClass
from shared.policy.quota import CohortPolicy, QuotaBook, QuotaPolicy, TenantQuota, charge, uncharge
from shared.policy.request import Demand, mig
from shared.policy.reserve import ReserveParams
from shared.policy.resources import COMPUTE
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of

pytestmark = pytest.mark.unit

GEO = default_geometry()
HIGH = PriorityClass(name="training-high", value=1000)
LOW = PriorityClass(name="inference-low", value=10, preemption="Never")
NO_RESERVE = ReserveParams(reserve_full=0)


class Cluster:
    """Just enough state to commit decisions: GPUs, each running job's charge, the quota book."""

    def __init__(self, gpus: list[GpuView], book: QuotaBook) -> None:
        self.gpus = {g.id: g for g in gpus}
        self.book = book
        self.charges: dict[str, tuple[str, dict[str, float]]] = {}
        self.requeued: list[tuple[str, str]] = []

    def snap(self) -> ClusterSnapshot:
        return snapshot_of(GEO, self.gpus.values())

    def submit(self, job: JobRequest, klass: PriorityClass, now: float = 100.0) -> Start | Hold:
        d = decide(self.snap(), self.book, job, klass, now, reserve=NO_RESERVE)
        if isinstance(d, Start):
            self.commit(job, d, now)
        return d

    def commit(self, job: JobRequest, d: Start, now: float) -> None:
        for v in d.victims:  # preempt first: free the instances, uncharge, re-queue with the reason
            self.finish(v.job_id)
            self.requeued.append((v.job_id, f"preempted by {job.job_id}: {v.detail}"))
        for k, slot in enumerate(d.placement.slots):
            g = self.gpus[slot.gpu_id]
            keep = [i for i in g.instances if i.id not in slot.destroy and i.id != slot.instance_id]
            template = InstanceView(id="", profile="", start=0, size=0, compute=0, job_id=job.job_id,
                                    priority=job.priority, tenant=job.tenant, started_at=now)
            iid = f"{job.job_id}-{k}"
            if slot.profile in (WHOLE_PROFILE, SHARE_PROFILE):
                inst = instance_for_slot(slot, template, iid)
            else:
                inst = msgspec.structs.replace(template, id=iid, profile=slot.profile, start=slot.start,
                                               size=slot.size, compute=slot.compute)
            self.gpus[g.id] = g.with_instances([*keep, inst])
        self.book = charge(self.book, job.tenant, d.usage)
        self.charges[job.job_id] = (job.tenant, d.usage)

    def finish(self, job_id: str) -> None:
        for gid, g in self.gpus.items():
            self.gpus[gid] = g.with_instances([i for i in g.instances if i.job_id != job_id])
        tenant, usage = self.charges.pop(job_id)
        self.book = uncharge(self.book, tenant, usage)


def _job(job_id: str, demand: Demand, klass: PriorityClass, tenant: str = "t") -> JobRequest:
    return JobRequest(job_id=job_id, demand=demand, priority=klass.value, tenant=tenant)


def _gpus(n: int, model: str = "A100-40GB") -> list[GpuView]:
    return [GpuView.build(id=f"g{i}", node="n0", index=i, model=model) for i in range(n)]


def test_a_high_priority_training_job_preempts_low_priority_inference_which_runs_again_later() -> None:
    c = Cluster(_gpus(2), QuotaBook())
    for k in range(14):
        assert isinstance(c.submit(_job(f"inf{k}", mig("1g.5gb"), LOW), LOW, now=float(k)), Start)
    assert isinstance(c.submit(_job("late", mig("1g.5gb"), LOW), LOW), Hold)  # full, and Never preempts
    train = _job("train", mig("7g.40gb"), HIGH)
    before = dict(c.gpus)
    d = c.submit(train, HIGH, now=100.0)
    assert isinstance(d, Start) and len(d.victims) == 7
    # of the two full GPUs, the one whose jobs lose the least work in total
    lost = {g.id: sum(100.0 - i.started_at for i in g.instances) for g in before.values()}
    assert sum(v.lost_work_s for v in d.victims) == min(lost.values())
    assert all("preempted by train" in why for _, why in c.requeued)
    c.finish("train")
    for job_id, _ in c.requeued:
        assert isinstance(c.submit(_job(job_id, mig("1g.5gb"), LOW), LOW), Start)


def test_a_tenant_over_quota_waits_with_reason_quota_and_starts_when_its_usage_drops() -> None:
    policy = QuotaPolicy([TenantQuota(name="a", quota={"nvidia.com/mig-2g.10gb": 1})])
    c = Cluster(_gpus(2), QuotaBook(policy))
    assert isinstance(c.submit(_job("a1", mig("2g.10gb"), LOW, "a"), LOW), Start)
    held = c.submit(_job("a2", mig("2g.10gb"), LOW, "a"), LOW)
    assert isinstance(held, Hold) and held.reason == "quota" and "quota is 1" in held.detail
    c.finish("a1")
    assert isinstance(c.submit(_job("a2", mig("2g.10gb"), LOW, "a"), LOW), Start)


def test_a_cohort_member_borrows_idle_quota_and_the_lender_reclaims_it_by_preemption() -> None:
    policy = QuotaPolicy([TenantQuota(name="lender", cohort="x", quota={COMPUTE: 7}),
                          TenantQuota(name="borrower", cohort="x", quota={COMPUTE: 7})],
                         [CohortPolicy(name="x")])
    c = Cluster(_gpus(2), QuotaBook(policy))
    # the borrower fills both GPUs: 7 slices of its own and 7 borrowed, at a high priority
    for k in range(2):
        d = c.submit(_job(f"b{k}", mig("7g.40gb"), HIGH, "borrower"), HIGH, now=float(k))
        assert isinstance(d, Start)
    assert c.book.borrowed("borrower").amount(COMPUTE) == 7
    over = c.submit(_job("b2", mig("1g.5gb"), HIGH, "borrower"), HIGH)
    assert isinstance(over, Hold) and over.reason == "quota"
    # the lender, at a lower priority that never preempts, takes its quota back from the borrower
    d = c.submit(_job("l1", mig("3g.20gb"), LOW, "lender"), LOW, now=50.0)
    assert isinstance(d, Start) and [v.why for v in d.victims] == ["reclaim"]
    assert d.victims[0].job_id == "b1"  # the newest borrower job loses the least work
    assert not c.book.borrowed("borrower")


def test_a_share_and_a_whole_gpu_job_start_on_plain_gpus_beside_mig_ones() -> None:
    plain = [GpuView.build(id="p0", node="n1", index=0, model="A100-40GB", mig=False, replicas=2),
             GpuView.build(id="p1", node="n1", index=1, model="A100-40GB", mig=False)]
    c = Cluster([*_gpus(1), *plain], QuotaBook())
    s = c.submit(_job("nb", Demand(kind="shared"), LOW), LOW)
    assert isinstance(s, Start) and s.placement.slot.gpu_id == "p0" and s.usage["nvidia.com/gpu.shared"] == 1
    w = c.submit(_job("big", Demand(kind="gpus", gpus=1), LOW), LOW)
    assert isinstance(w, Start) and w.placement.slot.gpu_id == "p1" and w.usage["nvidia.com/gpu"] == 1
    m = c.submit(_job("m", mig("3g.20gb"), LOW), LOW)
    assert isinstance(m, Start) and m.placement.slot.gpu_id == "g0"


def test_the_reserve_holds_a_small_job_with_its_own_reason_and_lets_a_full_size_job_through() -> None:
    c = Cluster(_gpus(1), QuotaBook())
    k1 = ReserveParams(reserve_full=1)
    small = decide(c.snap(), c.book, _job("s", mig("1g.5gb"), LOW), LOW, 0.0, reserve=k1)
    assert isinstance(small, Hold) and small.reason == "reserved capacity"
    big = decide(c.snap(), c.book, _job("b", mig("7g.40gb"), LOW), LOW, 0.0, reserve=k1)
    assert isinstance(big, Start)
