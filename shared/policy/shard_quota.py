"""A tenant's quota as bounds on one shard's usage counters: what the store's ``reserve`` transition checks in
the same step as a placement (``shared.state``), so that balancer replicas deciding from books a moment old
cannot together overshoot a quota. The rule is ``quota.admit``'s, restated on the shard's counters."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import msgspec

from shared.policy.quota import QuotaPolicy


class QuotaLimit(msgspec.Struct, frozen=True, kw_only=True):
    """One resource of a tenant's quota as a shard's ``reserve`` checks it: the amounts are what the shard itself
    may hold, the tenant's and its cohort's use in other shards taken off (``shard_limits``)."""

    resource: str
    cap: float | None = None
    """The most the tenant may use (its quota plus its borrowing limit); None: no limit of its own."""
    nominal: float = 0.0
    """Its quota: above it, the cohort must have the amount unused."""
    members: tuple[str, ...] = ()
    """The cohort's members that limit ``resource`` (the tenant among them); empty: no cohort."""
    cohort_cap: float = 0.0
    """The sum of those members' quotas."""


def shard_limits(policy: QuotaPolicy, tenant: str, usage: Mapping[str, float],
                 elsewhere: Callable[[str, str], float]) -> tuple[QuotaLimit, ...]:
    """``admit``'s rule for a job of ``tenant`` charged ``usage``, as limits on one shard's counters:
    ``elsewhere(t, resource)`` is what tenant ``t`` uses outside that shard. A shard holding its counters to
    these admits exactly what ``admit`` would over the whole cluster's usage; none for a tenant without a
    quota."""
    tq = policy.tenant(tenant)
    if tq is None:
        return ()
    out: list[QuotaLimit] = []
    for r, q in sorted(usage.items()):
        nom = tq.nominal(r)
        if q <= 0 or math.isinf(nom):
            continue
        off = elsewhere(tenant, r)
        if tq.cohort is None:
            out.append(QuotaLimit(resource=r, cap=nom - off, nominal=nom - off))
            continue
        borrow = tq.borrow_cap(r)
        members = tuple(m for m in policy.members.get(tq.cohort, ()) if not math.isinf(policy.tenants[m].nominal(r)))
        cohort_cap = sum(policy.tenants[m].nominal(r) - elsewhere(m, r) for m in members)
        out.append(QuotaLimit(resource=r, cap=None if math.isinf(borrow) else nom + borrow - off, nominal=nom - off,
                              members=members, cohort_cap=cohort_cap))
    return tuple(out)
