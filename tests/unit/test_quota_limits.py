"""``shard_quota.shard_limits``: a shard holding its usage counters to these limits (the store's ``reserve`` check)
admits exactly what ``quota.admit`` admits over the whole cluster's usage, however that usage is split between
the shard and the others."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.policy.quota import Admit, QuotaBook, QuotaPolicy, TenantQuota, admit
from shared.policy.resources import Usage
from shared.policy.shard_quota import shard_limits
from shared.state import usage as counters
from shared.state.memory_prelude import _Shard
from shared.state.memory_reserve import over_quota
from shared.state.model import Reservation, StoredInstance

pytestmark = pytest.mark.unit
TENANTS = ("a", "b", "c")
RESOURCES = ("compute_slices", "memory_gib")
amount = st.integers(0, 2)  # small against the quotas, so that the cohort check often decides


@st.composite
def cases(draw: Any) -> tuple[QuotaPolicy, dict[str, dict[str, int]], dict[str, dict[str, int]], dict[str, int]]:
    """A policy of three tenants (some in one cohort, quotas and borrowing limits on some resources), each
    tenant's usage in this shard and in the others, and a request of tenant ``a``."""
    tenants = []
    for t in TENANTS:
        quota = {r: draw(st.integers(0, 4)) for r in RESOURCES if draw(st.booleans())}
        borrowing = {r: draw(st.integers(0, 3)) for r in RESOURCES if draw(st.integers(0, 2)) == 0}
        cohort = draw(st.sampled_from(["co", "co", "co", "co", None]))
        tenants.append(TenantQuota(name=t, cohort=cohort, quota=quota, borrowing_limit=borrowing or None))
    here = {t: {r: draw(amount) for r in RESOURCES} for t in TENANTS}
    there = {t: {r: draw(amount) for r in RESOURCES} for t in TENANTS}
    request = {r: draw(st.integers(0, 3)) for r in RESOURCES}
    return QuotaPolicy(tenants), here, there, request


def _shard(here: dict[str, dict[str, int]]) -> _Shard:
    sh = _Shard()
    for t, used in here.items():
        for r, v in used.items():
            if v:
                sh.usage[counters.field(t, r)] = float(v)
    return sh


def _reservation(request: dict[str, int], limits: Any) -> Reservation:
    inst = StoredInstance(id="n1/0:1g.5gb@0:j", profile="1g.5gb", start=0, size=1, compute=1)
    return Reservation(job_id="j", gpu_id="n1/0", expected_ver=1, instance=inst, action="create", tenant="a",
                       usage={r: float(v) for r, v in request.items()}, limits=limits)


@settings(max_examples=400, deadline=None)
@given(cases())
def test_a_shard_held_to_its_limits_admits_exactly_what_the_cluster_wide_rule_admits(case: Any) -> None:
    policy, here, there, request = case
    book = QuotaBook(policy, {t: Usage({r: here[t][r] + there[t][r] for r in RESOURCES}) for t in TENANTS})
    limits = shard_limits(policy, "a", request, lambda t, r: float(there[t][r]))
    admitted = isinstance(admit(book, "a", request), Admit)
    refused = over_quota(_shard(here), _reservation(request, limits))
    assert admitted == (refused is None), (limits, refused)


def test_a_tenant_without_a_quota_gets_no_limits() -> None:
    policy = QuotaPolicy([TenantQuota(name="a", quota={"compute_slices": 2})])
    assert shard_limits(policy, "nobody", {"compute_slices": 5}, lambda t, r: 0.0) == ()
    assert shard_limits(policy, "a", {"memory_gib": 5}, lambda t, r: 0.0) == ()  # not limited on memory


def test_what_the_tenant_uses_elsewhere_is_taken_off_its_limit_here() -> None:
    policy = QuotaPolicy([TenantQuota(name="a", quota={"compute_slices": 7})])
    (lim,) = shard_limits(policy, "a", {"compute_slices": 3}, lambda t, r: 4.0)
    assert (lim.cap, lim.nominal, lim.members) == (3.0, 3.0, ())
