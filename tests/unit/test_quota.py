"""Quota accounting: device counts and fungible units, cohort borrowing, reclaimable excess."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.mig.geometry import default_geometry
from shared.policy.charges import capacity_of, placement_usage, profile_usage, request_usages, whole_gpu_usage
from shared.policy.placement.decision import JobRequest
from shared.policy.placement.sharing import place_share
from shared.policy.quota import (
    Admit,
    CohortPolicy,
    QuotaBook,
    QuotaError,
    QuotaPolicy,
    TenantQuota,
    Unlisted,
    Wait,
    admit,
    admit_any,
    charge,
    headroom,
    uncharge,
    within_nominal,
)
from shared.policy.request import Demand, mig, sized
from shared.policy.resources import COMPUTE, GPU, MEMORY, SHARED, Usage
from shared.policy.snapshot import ClusterSnapshot, GpuView, snapshot_of

pytestmark = pytest.mark.unit

GEO = default_geometry()
A100 = GEO.model("A100-80GB")
P2G = A100.profile("2g.20gb")
P1G = A100.profile("1g.10gb")


def _book(*tenants: TenantQuota, unknown: str = "unlimited") -> QuotaBook:
    cohorts = {t.cohort for t in tenants if t.cohort}
    return QuotaBook(QuotaPolicy(tenants, [CohortPolicy(name=c) for c in cohorts], unknown))  # type: ignore[arg-type]


def test_a_profile_is_charged_one_instance_plus_its_compute_slices_and_gib() -> None:
    u = profile_usage(P2G)
    assert u == {"nvidia.com/mig-2g.20gb": 1, COMPUTE: 2, MEMORY: 19.5}


def test_a_tenant_within_its_profile_count_is_admitted_and_the_next_one_waits_with_reason_quota() -> None:
    book = _book(TenantQuota(name="a", quota={"nvidia.com/mig-2g.20gb": 2}))
    for _ in range(2):
        a = admit(book, "a", profile_usage(P2G))
        assert isinstance(a, Admit) and not a.borrows
        book = charge(book, "a", profile_usage(P2G))
    w = admit(book, "a", profile_usage(P2G))
    assert isinstance(w, Wait)
    assert w.reason == "quota" and w.resource == "nvidia.com/mig-2g.20gb" and w.limit == 2
    assert "quota is 2" in w.detail


def test_a_profile_count_allow_list_denies_other_profiles_like_a_whitelist() -> None:
    book = _book(TenantQuota(name="a", quota={"nvidia.com/mig-2g.20gb": 4, GPU: 2}))
    assert isinstance(admit(book, "a", profile_usage(P1G)), Wait)
    assert isinstance(admit(book, "a", whole_gpu_usage(A100, 2)), Admit)
    assert isinstance(admit(book, "a", whole_gpu_usage(A100, 3)), Wait)


def test_fungible_limits_let_a_tenant_use_any_profile_mix_within_its_share() -> None:
    book = _book(TenantQuota(name="a", quota={COMPUTE: 7, MEMORY: 80}))
    for p in ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"):
        u = profile_usage(A100.profile(p))
        assert isinstance(admit(book, "a", u), Admit), p
        book = charge(book, "a", u)
    w = admit(book, "a", profile_usage(P1G))
    assert isinstance(w, Wait) and w.resource == COMPUTE


def test_a_tenant_absent_from_the_file_is_unlimited_unless_unknown_tenants_is_deny() -> None:
    assert isinstance(admit(_book(), "nobody", whole_gpu_usage(A100, 8)), Admit)
    w = admit(_book(unknown="deny"), "nobody", profile_usage(P1G))
    assert isinstance(w, Wait) and "no quota" in w.detail


def test_a_cohort_member_borrows_unused_quota_and_the_borrowed_part_is_marked() -> None:
    book = _book(TenantQuota(name="a", cohort="c", quota={COMPUTE: 4}),
                 TenantQuota(name="b", cohort="c", quota={COMPUTE: 4}))
    book = charge(book, "a", {COMPUTE: 4})
    a = admit(book, "a", {COMPUTE: 3})
    assert isinstance(a, Admit) and a.borrowed == {COMPUTE: 3}
    book = charge(book, "a", {COMPUTE: 3})
    assert book.borrowed("a") == {COMPUTE: 3}
    assert book.borrowing("c") == {"a": Usage({COMPUTE: 3})}
    w = admit(book, "a", {COMPUTE: 2})
    assert isinstance(w, Wait) and "cohort c has 1 unused" in w.detail


def test_the_borrowing_limit_caps_what_a_member_may_borrow() -> None:
    book = _book(TenantQuota(name="a", cohort="c", quota={COMPUTE: 2}, borrowing_limit={COMPUTE: 1}),
                 TenantQuota(name="b", cohort="c", quota={COMPUTE: 10}))
    assert isinstance(admit(book, "a", {COMPUTE: 3}), Admit)
    w = admit(book, "a", {COMPUTE: 4})
    assert isinstance(w, Wait) and "borrowing limit is 1" in w.detail


def test_a_tenant_without_a_cohort_never_borrows() -> None:
    book = _book(TenantQuota(name="a", quota={COMPUTE: 2}), TenantQuota(name="b", quota={COMPUTE: 10}))
    assert isinstance(admit(book, "a", {COMPUTE: 3}), Wait)


def test_a_job_larger_than_all_its_tenant_may_ever_use_waits_saying_that_only_a_raised_quota_runs_it() -> None:
    book = _book(TenantQuota(name="solo", quota={GPU: 4}),
                 TenantQuota(name="a", cohort="c", quota={GPU: 2}, borrowing_limit={GPU: 2}),
                 TenantQuota(name="b", cohort="c", quota={GPU: 10}))
    never = "it runs only once the tenancy file raises it"
    assert never in admit(book, "solo", {GPU: 8}).detail  # type: ignore[union-attr]
    assert "more than its whole quota" in admit(book, "solo", {GPU: 8}).detail  # type: ignore[union-attr]
    assert "its quota and borrowing limit together" in admit(book, "a", {GPU: 5}).detail  # type: ignore[union-attr]
    assert "cohort c's whole quota" in admit(book, "b", {GPU: 13}).detail  # type: ignore[union-attr]
    busy = charge(book, "solo", Usage({GPU: 2}))
    assert never not in admit(busy, "solo", {GPU: 3}).detail  # type: ignore[union-attr]  # it fits once others end


def test_a_lender_within_its_nominal_is_admitted_even_when_its_quota_is_lent_out() -> None:
    book = _book(TenantQuota(name="a", cohort="c", quota={COMPUTE: 4}),
                 TenantQuota(name="b", cohort="c", quota={COMPUTE: 4}))
    book = charge(book, "b", {COMPUTE: 8})  # b borrowed all of a's quota
    assert within_nominal(book, "a", {COMPUTE: 4})
    a = admit(book, "a", {COMPUTE: 4})
    assert isinstance(a, Admit) and not a.borrows


def test_uncharging_returns_to_the_previous_book_and_below_zero_is_a_fault() -> None:
    book = _book(TenantQuota(name="a", quota={MEMORY: 100}))
    after = uncharge(charge(book, "a", profile_usage(P2G)), "a", profile_usage(P2G))
    assert after.used("a") == {}
    with pytest.raises(QuotaError, match="negative"):
        uncharge(book, "a", profile_usage(P2G))


def test_books_are_immutable_values() -> None:
    book = _book(TenantQuota(name="a", quota={COMPUTE: 4}))
    charged = charge(book, "a", {COMPUTE: 1})
    assert book.used("a") == {} and charged.used("a") == {COMPUTE: 1}
    with pytest.raises(TypeError):
        book.usage["a"] = Usage({COMPUTE: 1})  # type: ignore[index]


def test_a_reloaded_policy_keeps_usage_and_new_jobs_wait_under_a_lowered_quota() -> None:
    book = charge(_book(TenantQuota(name="a", quota={COMPUTE: 8})), "a", {COMPUTE: 6})
    lowered = book.with_policy(QuotaPolicy([TenantQuota(name="a", quota={COMPUTE: 4})]))
    assert lowered.used("a") == {COMPUTE: 6}
    assert isinstance(admit(lowered, "a", {COMPUTE: 1}), Wait)


def test_headroom_lists_used_nominal_and_borrowable_per_resource() -> None:
    book = _book(TenantQuota(name="a", cohort="c", quota={COMPUTE: 4}, borrowing_limit={COMPUTE: 2}),
                 TenantQuota(name="b", cohort="c", quota={COMPUTE: 4}))
    h = headroom(charge(book, "a", {COMPUTE: 5}), "a")
    assert h[COMPUTE] == (5, 4, 6)


def _snap(*gpus: GpuView) -> ClusterSnapshot:
    return snapshot_of(GEO, gpus)


def test_request_usages_give_one_charge_per_gpu_model_that_could_host_the_request() -> None:
    snap = _snap(GpuView.build(id="a", node="n", index=0, model="A100-40GB"),
                 GpuView.build(id="b", node="n", index=1, model="A100-80GB"))
    shapes = request_usages(snap, mig("3g"))
    assert {u.amount(MEMORY) for u in shapes} == {19.62, 39.25}
    assert request_usages(snap, mig("3g.40gb")) == (profile_usage(A100.profile("3g.40gb")),)
    sized_opts = request_usages(snap, sized(1, 15))
    assert [u.amount(COMPUTE) for u in sized_opts] == [3, 1]  # 15 GiB needs a 3g on A100-40GB


def test_admit_any_admits_when_one_model_option_fits_the_allow_list() -> None:
    book = _book(TenantQuota(name="a", quota={"nvidia.com/mig-3g.40gb": 1}))
    snap = _snap(GpuView.build(id="a", node="n", index=0, model="A100-40GB"),
                 GpuView.build(id="b", node="n", index=1, model="A100-80GB"))
    assert isinstance(admit_any(book, "a", request_usages(snap, mig("3g"))), Admit)


def test_a_share_is_charged_one_share_and_its_nominal_fraction_of_the_gpu() -> None:
    snap = _snap(GpuView.build(id="s", node="n", index=0, model="A100-80GB", mig=False, replicas=4))
    job = JobRequest(job_id="j", demand=Demand(kind="shared"))
    placed = place_share(snap, job)
    u = placement_usage(snap, placed, job.demand)  # type: ignore[arg-type]
    assert u == {SHARED: 1, COMPUTE: 7 / 4, MEMORY: 20}
    assert request_usages(snap, job.demand) == (u,)


def test_cluster_capacity_counts_healthy_gpus_only() -> None:
    snap = _snap(GpuView.build(id="a", node="n", index=0, model="A100-80GB"),
                 GpuView.build(id="b", node="n", index=1, model="A100-80GB", healthy=False))
    assert capacity_of(snap) == {COMPUTE: 7, MEMORY: 80}


# ---- the property: quota is never exceeded except by lent capacity that is reclaimable -------------------

RESOURCES = (COMPUTE, MEMORY, GPU, "nvidia.com/mig-1g.10gb")
TENANTS = ("a", "b", "c", "solo")


@st.composite
def _policies(draw: st.DrawFn) -> QuotaPolicy:
    tenants = []
    for name in TENANTS:
        listed = draw(st.sets(st.sampled_from(RESOURCES), max_size=3))
        quota = {r: float(draw(st.integers(0, 8))) for r in listed}
        cohort = None if name == "solo" else draw(st.sampled_from([None, "x"]))
        limit = None
        if cohort and draw(st.booleans()):
            limit = {r: float(draw(st.integers(0, 4))) for r in draw(st.sets(st.sampled_from(RESOURCES)))}
        unlisted: Unlisted = draw(st.sampled_from(["auto", "deny", "unlimited"]))
        tenants.append(TenantQuota(name=name, cohort=cohort, quota=quota, borrowing_limit=limit,
                                   unlisted=unlisted))
    return QuotaPolicy(tenants, [CohortPolicy(name="x")])


_requests = st.dictionaries(st.sampled_from(RESOURCES), st.integers(1, 4).map(float), min_size=1, max_size=3)
_steps = st.lists(st.tuples(st.sampled_from(TENANTS), _requests, st.booleans()), max_size=40)


@settings(max_examples=150, deadline=None)
@given(_policies(), _steps)
def test_quota_is_never_exceeded_except_by_borrowed_capacity_that_stays_reclaimable(
    policy: QuotaPolicy, steps: list[tuple[str, dict[str, float], bool]]
) -> None:
    book = QuotaBook(policy)
    running: list[tuple[str, dict[str, float]]] = []
    for tenant, request, finish_one in steps:
        if finish_one and running:
            t, u = running.pop(0)
            book = uncharge(book, t, u)
            continue
        decision = admit(book, tenant, request)
        if isinstance(decision, Wait):
            assert decision.reason == "quota"
            continue
        before = book
        book = charge(book, tenant, request)
        running.append((tenant, request))
        tq = policy.tenant(tenant)
        assert tq is not None
        for r in request:
            used, nom = book.used(tenant).amount(r), tq.nominal(r)
            if used <= nom + 1e-9:
                continue
            # above its own quota only by borrowing, within its limit, from a cohort that had it unused
            assert tq.cohort is not None
            assert used - nom <= tq.borrow_cap(r) + 1e-9
            c_used, c_nom = before.cohort_totals(tq.cohort, r)
            assert c_used + request[r] <= c_nom + 1e-9
            assert decision.borrowed.get(r, 0) > 0
            assert r in book.borrowed(tenant)  # the excess is visible to reclaim
    for t in TENANTS:
        tq = policy.tenant(t)
        assert tq is not None
        for r, used in book.used(t).items():
            nom = tq.nominal(r)
            if tq.cohort is None:
                assert used <= nom + 1e-9 or math.isinf(nom)
            else:
                assert used <= nom + tq.borrow_cap(r) + 1e-9
