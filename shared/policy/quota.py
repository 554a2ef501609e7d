"""Tenant quotas with cohort borrowing and reclaim (Kueue's model, in the units people ask for).

Resources (the names a quota file uses):

- ``nvidia.com/mig-<profile>``: a count of MIG instances of that profile (``nvidia.com/mig-2g.20gb: 4``);
- ``nvidia.com/gpu``: a count of whole GPUs (non-MIG GPUs, or MIG GPUs taken whole by a ``gpus: n`` job);
- ``nvidia.com/gpu.shared``: a count of time-sliced shares;
- ``compute_slices`` and ``memory_gib``: fungible limits that every job is charged in, so a tenant with only
  these can use any mix of profiles, whole GPUs and shares within its share. A whole GPU charges its model's
  compute slices and GiB; a time-sliced share charges 1/replicas of its GPU.

For tenant ``t`` and resource ``r``, the **nominal** quota is ``quota[r]`` when listed. An unlisted resource
is unlimited, except that ``unlisted = "deny"`` (or ``"auto"`` for a tenant that lists device counts and no
fungible limit, i.e. a Kubernetes-style allow-list) gives it a nominal of 0 — which a cohort member may still
borrow.

A tenant in a **cohort** may use more than its nominal by borrowing the cohort's unused nominal quota, up to
its ``borrowing_limit[r]`` (absent = no limit): a borrowing admission needs ``sum(used) + request <=
sum(nominal)`` over the cohort's members that limit ``r``. An admission within the tenant's own nominal is
never refused for the cohort's sake (its nominal is guaranteed); when the cluster is then full, the lender
reclaims its quota by preempting borrowers (``shared.policy.preemption``, reclaim mode). Every unit above a
tenant's nominal is borrowed and therefore reclaimable: ``QuotaBook.borrowing`` says which tenants are
borrowing which resources.

Everything here is pure: a ``QuotaBook`` is an immutable (policy, per-tenant usage) pair;
``charge``/``uncharge`` return new books. What a job is charged (from its demand, its placement, or a running
instance) is in ``shared.policy.charges``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Annotated, Literal

import msgspec

from shared.errors import MigschedError
from shared.policy.resources import DIGITS, EMPTY, EPS, FUNGIBLE, Usage, is_count


class QuotaError(MigschedError):
    """Quota accounting went wrong (uncharging what was never charged); a fault, never a "must wait"."""


# ---- the configuration a book reads ------------------------------------------------------------------------

Amount = Annotated[float, msgspec.Meta(ge=0)]
Unlisted = Literal["auto", "deny", "unlimited"]


class TenantQuota(msgspec.Struct, frozen=True, kw_only=True):
    """One tenant's quota: nominal amounts, cohort, borrowing limit, and what an unlisted resource means."""

    name: str
    cohort: str | None = None
    quota: dict[str, Amount] = {}
    borrowing_limit: dict[str, Amount] | None = None
    """How far above its nominal the tenant may borrow, per resource (None or absent: no limit)."""
    unlisted: Unlisted = "auto"

    def denies_unlisted(self) -> bool:
        if self.unlisted != "auto":
            return self.unlisted == "deny"
        lists_counts = any(is_count(r) for r in self.quota)
        lists_fungible = any(r in FUNGIBLE for r in self.quota)
        return lists_counts and not lists_fungible

    def nominal(self, resource: str) -> float:
        """The guaranteed amount; ``inf`` when the tenant is not limited on ``resource``."""
        if resource in self.quota:
            return float(self.quota[resource])
        if is_count(resource) and self.denies_unlisted():
            return 0.0
        if self.borrowing_limit is not None and resource in self.borrowing_limit:
            return 0.0
        return math.inf

    def borrow_cap(self, resource: str) -> float:
        if self.cohort is None:
            return 0.0
        if self.borrowing_limit is None or resource not in self.borrowing_limit:
            return math.inf
        return float(self.borrowing_limit[resource])


class CohortPolicy(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    reclaim: Literal["Any", "LowerPriority", "Never"] = "Any"
    """Which borrowers a member within its nominal may preempt to take its quota back (Kueue's
    ``reclaimWithinCohort``): any borrower, only lower-priority ones, or none."""
    description: str = ""


class QuotaPolicy:
    """All tenants' quotas and cohorts, with per-cohort nominal sums precomputed."""

    __slots__ = ("cohorts", "members", "tenants", "unknown_tenants")

    def __init__(
        self,
        tenants: Iterable[TenantQuota] = (),
        cohorts: Iterable[CohortPolicy] = (),
        unknown_tenants: Literal["unlimited", "deny"] = "unlimited",
    ) -> None:
        self.tenants: Mapping[str, TenantQuota] = MappingProxyType({t.name: t for t in tenants})
        self.cohorts: Mapping[str, CohortPolicy] = MappingProxyType({c.name: c for c in cohorts})
        members: dict[str, list[str]] = {}
        for t in self.tenants.values():
            if t.cohort is not None:
                members.setdefault(t.cohort, []).append(t.name)
        self.members: Mapping[str, tuple[str, ...]] = MappingProxyType(
            {c: tuple(sorted(ms)) for c, ms in members.items()}
        )
        self.unknown_tenants = unknown_tenants

    def tenant(self, name: str) -> TenantQuota | None:
        return self.tenants.get(name)

    def cohort_of(self, tenant: str) -> str | None:
        t = self.tenants.get(tenant)
        return t.cohort if t is not None else None

    def cohort_policy(self, cohort: str) -> CohortPolicy:
        return self.cohorts.get(cohort) or CohortPolicy(name=cohort)


UNLIMITED = QuotaPolicy()


class QuotaBook:
    """Immutable: a quota policy plus what each tenant uses now."""

    __slots__ = ("_used", "policy")

    def __init__(self, policy: QuotaPolicy = UNLIMITED, used: Mapping[str, Usage] | None = None) -> None:
        self.policy = policy
        self._used: Mapping[str, Usage] = MappingProxyType({t: u for t, u in (used or {}).items() if u})

    def used(self, tenant: str) -> Usage:
        return self._used.get(tenant, EMPTY)

    @property
    def usage(self) -> Mapping[str, Usage]:
        return self._used

    def with_policy(self, policy: QuotaPolicy) -> QuotaBook:
        """The same usage under a reloaded policy (usage above a lowered quota stays; new jobs wait)."""
        return QuotaBook(policy, self._used)

    def borrowed(self, tenant: str) -> Usage:
        """What the tenant uses above its nominal quota, per resource (all of it reclaimable)."""
        tq = self.policy.tenant(tenant)
        if tq is None:
            return EMPTY
        return Usage({r: v - tq.nominal(r) for r, v in self.used(tenant).items() if v > tq.nominal(r) + EPS})

    def borrowing(self, cohort: str) -> dict[str, Usage]:
        """The cohort's members that are borrowing, with what they borrow."""
        out: dict[str, Usage] = {}
        for m in self.policy.members.get(cohort, ()):
            b = self.borrowed(m)
            if b:
                out[m] = b
        return out

    def cohort_totals(self, cohort: str, resource: str) -> tuple[float, float]:
        """(used, nominal) summed over the cohort's members that limit ``resource``."""
        used = nominal = 0.0
        for m in self.policy.members.get(cohort, ()):
            n = self.policy.tenants[m].nominal(resource)
            if math.isinf(n):
                continue
            nominal += n
            used += self.used(m).amount(resource)
        return used, nominal


class Admit(msgspec.Struct, frozen=True, kw_only=True):
    """The request fits the tenant's quota; ``borrowed`` is the part above its nominal (reclaimable)."""

    tenant: str
    borrowed: dict[str, float] = {}
    reasons: tuple[str, ...] = ()

    @property
    def borrows(self) -> bool:
        return bool(self.borrowed)


class Wait(msgspec.Struct, frozen=True, kw_only=True):
    """The request must wait: admitting it now would exceed the quota. Not a rejection."""

    tenant: str
    reason: Literal["quota"] = "quota"
    detail: str
    resource: str = ""
    requested: float = 0.0
    used: float = 0.0
    limit: float = 0.0


Admission = Admit | Wait


def _never(requested: float, most: float, what: str) -> str:
    """Said of a request no amount of waiting admits: more than ``most``, the most its tenant may ever use. It
    still waits rather than being refused, as the tenancy file may be raised while it waits (a reload)."""
    if requested <= most + EPS:
        return ""
    return f" (the job alone asks more than {what}: it runs only once the tenancy file raises it)"


def admit(book: QuotaBook, tenant: str, usage: Mapping[str, float]) -> Admission:
    """Whether ``tenant`` may start a job charged ``usage`` now, and how much of it is borrowed."""
    tq = book.policy.tenant(tenant)
    if tq is None:
        if book.policy.unknown_tenants == "deny":
            return Wait(tenant=tenant, detail=f"tenant {tenant!r} has no quota in the tenancy file")
        return Admit(tenant=tenant, reasons=(f"tenant {tenant!r} has no quota: unlimited",))
    used = book.used(tenant)
    borrowed: dict[str, float] = {}
    reasons: list[str] = []
    for r, q in sorted(usage.items()):
        if q <= 0:
            continue
        nom = tq.nominal(r)
        if math.isinf(nom):
            continue
        have = used.amount(r)
        new = have + q
        if new <= nom + EPS:
            continue
        over = new - max(nom, have)
        cap = tq.borrow_cap(r)
        if tq.cohort is None:
            return Wait(tenant=tenant, resource=r, requested=q, used=have, limit=nom,
                        detail=f"{tenant} would use {new:g} {r}; its quota is {nom:g}"
                               + _never(q, nom, "its whole quota"))
        if new - nom > cap + EPS:
            return Wait(tenant=tenant, resource=r, requested=q, used=have, limit=nom + cap,
                        detail=f"{tenant} would borrow {new - nom:g} {r} from cohort {tq.cohort}; "
                               f"its borrowing limit is {cap:g} (quota {nom:g})"
                               + _never(q, nom + cap, "its quota and borrowing limit together"))
        c_used, c_nom = book.cohort_totals(tq.cohort, r)
        if c_used + q > c_nom + EPS:
            return Wait(tenant=tenant, resource=r, requested=q, used=have, limit=nom,
                        detail=f"{tenant} would use {new:g} {r} (quota {nom:g}) and cohort {tq.cohort} has "
                               f"{max(c_nom - c_used, 0):g} unused to lend"
                               + _never(q, c_nom, f"cohort {tq.cohort}'s whole quota"))
        borrowed[r] = round(over, DIGITS)
        reasons.append(f"borrows {over:g} {r} from cohort {tq.cohort}")
    if not reasons:
        reasons.append(f"within {tenant}'s quota")
    return Admit(tenant=tenant, borrowed=borrowed, reasons=tuple(reasons))


def within_nominal(book: QuotaBook, tenant: str, usage: Mapping[str, float]) -> bool:
    """True when the request fits the tenant's own nominal quota (so it may reclaim what it lent)."""
    tq = book.policy.tenant(tenant)
    if tq is None:
        return False
    used = book.used(tenant)
    return all(q <= 0 or used.amount(r) + q <= tq.nominal(r) + EPS for r, q in usage.items())


def charge(book: QuotaBook, tenant: str, usage: Mapping[str, float]) -> QuotaBook:
    """The book after ``tenant`` starts a job charged ``usage`` (call after ``admit`` said Admit)."""
    used = dict(book.usage)
    used[tenant] = used.get(tenant, EMPTY) + usage
    return QuotaBook(book.policy, used)


def uncharge(book: QuotaBook, tenant: str, usage: Mapping[str, float]) -> QuotaBook:
    """The book after a job of ``tenant`` ended or was preempted. Raises QuotaError below zero."""
    now = book.used(tenant) - usage
    bad = now.negative()
    if bad:
        raise QuotaError(f"uncharging {tenant} would leave negative usage of {', '.join(bad)}: "
                         f"used {book.used(tenant)!r}, released {Usage(usage)!r}")
    used = dict(book.usage)
    used[tenant] = now
    return QuotaBook(book.policy, used)


def headroom(book: QuotaBook, tenant: str) -> dict[str, tuple[float, float, float]]:
    """Per limited resource: (used, nominal, nominal + borrow cap), for ``migsched quota show``."""
    tq = book.policy.tenant(tenant)
    if tq is None:
        return {}
    keys = set(tq.quota) | set(tq.borrowing_limit or {}) | set(book.used(tenant))
    out: dict[str, tuple[float, float, float]] = {}
    for r in sorted(keys):
        nom = tq.nominal(r)
        out[r] = (book.used(tenant).amount(r), nom, nom + tq.borrow_cap(r))
    return out



def admit_any(book: QuotaBook, tenant: str, options: Iterable[Mapping[str, float]]) -> Admission:
    """Admit when any of the request's possible charges fits (one per GPU model it may land on); otherwise the
    first option's Wait. Used before placement, when the model is not known yet."""
    first: Wait | None = None
    for usage in options:
        a = admit(book, tenant, usage)
        if isinstance(a, Admit):
            return a
        first = first or a
    return first if first is not None else admit(book, tenant, EMPTY)
