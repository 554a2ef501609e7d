"""Pending queue order: priority, then dominant-resource fair share between tenants, then age."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.policy.queue_order import PendingJob, QueueEntry, dominant_share, order
from shared.policy.quota import QuotaBook, QuotaPolicy, TenantQuota, charge
from shared.policy.resources import COMPUTE, MEMORY, Usage

pytestmark = pytest.mark.unit

CAP = Usage({COMPUTE: 70, MEMORY: 800})
SMALL = Usage({COMPUTE: 1, MEMORY: 10})


def _job(job_id: str, tenant: str, prio: int = 0, at: float = 0.0, usage: Usage = SMALL) -> PendingJob:
    return PendingJob(job_id=job_id, tenant=tenant, priority=prio, submitted_at=at, usages=(usage,))


def _ids(entries: list[QueueEntry]) -> list[str]:
    return [e.job.job_id for e in entries]


def test_higher_priority_goes_first_whatever_the_age_or_share() -> None:
    book = charge(QuotaBook(), "rich", {COMPUTE: 60})
    got = order([_job("old-low", "a", 0, at=0), _job("new-high", "rich", 9, at=100)], book, CAP)
    assert _ids(got) == ["new-high", "old-low"]


def test_within_a_priority_the_tenant_with_the_lower_dominant_share_goes_first() -> None:
    book = charge(QuotaBook(), "heavy", {COMPUTE: 35})
    got = order([_job("h", "heavy", at=0), _job("l", "light", at=50)], book, CAP)
    assert _ids(got) == ["l", "h"]
    assert got[0].share == 0 and got[1].share == 0.5


def test_a_burst_from_one_tenant_interleaves_with_the_others() -> None:
    jobs = [_job(f"a{i}", "a", at=i) for i in range(3)] + [_job(f"b{i}", "b", at=10 + i) for i in range(3)]
    assert _ids(order(jobs, QuotaBook(), CAP)) == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_age_breaks_ties_between_equal_shares() -> None:
    got = order([_job("young", "a", at=5), _job("old", "b", at=1)], QuotaBook(), CAP)
    assert _ids(got) == ["old", "young"]


def test_memory_can_be_the_dominant_resource() -> None:
    book = charge(QuotaBook(), "mem", {COMPUTE: 1, MEMORY: 400})
    assert dominant_share(book, "mem", book.used("mem"), CAP) == 0.5


def test_shares_are_relative_to_the_tenants_quota_when_it_has_one() -> None:
    policy = QuotaPolicy([TenantQuota(name="big", quota={COMPUTE: 60}),
                          TenantQuota(name="small", quota={COMPUTE: 10})])
    book = charge(charge(QuotaBook(policy), "big", {COMPUTE: 20}), "small", {COMPUTE: 5})
    # big uses 1/3 of its quota, small 1/2 of its: big goes first
    got = order([_job("s", "small", at=0), _job("b", "big", at=1)], book, CAP)
    assert _ids(got) == ["b", "s"]


def test_a_job_over_its_tenants_quota_waits_with_reason_quota_after_the_ready_ones() -> None:
    policy = QuotaPolicy([TenantQuota(name="capped", quota={COMPUTE: 1})])
    book = charge(QuotaBook(policy), "capped", {COMPUTE: 1})
    got = order([_job("c", "capped", prio=9, at=0), _job("f", "free", at=5)], book, CAP)
    assert _ids(got) == ["f", "c"]
    assert got[1].status == "quota" and "quota is 1" in got[1].detail
    assert got[0].status == "ready" and [e.rank for e in got] == [0, 1]


_pending = st.lists(
    st.tuples(st.sampled_from("abcd"), st.integers(0, 2), st.integers(0, 50), st.integers(1, 7)),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(_pending)
def test_order_is_a_permutation_sorted_by_priority_and_fifo_within_each_tenant_and_priority(
    specs: list[tuple[str, int, int, int]]
) -> None:
    jobs = [_job(f"j{k}", t, p, float(at), Usage({COMPUTE: c, MEMORY: 10 * c}))
            for k, (t, p, at, c) in enumerate(specs)]
    got = order(jobs, QuotaBook(), CAP)
    assert sorted(_ids(got)) == sorted(j.job_id for j in jobs)
    prios = [e.job.priority for e in got]
    assert prios == sorted(prios, reverse=True)
    for t in "abcd":
        for p in range(3):
            mine = [e.job for e in got if e.job.tenant == t and e.job.priority == p]
            assert mine == sorted(mine, key=lambda j: (j.submitted_at, j.job_id))
