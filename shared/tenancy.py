"""The tenancy file: tenants' quotas, cohorts and priority classes (TOML), validated, diffed and hot-reloaded.

::

    [defaults]
    unknown_tenants = "unlimited"          # "deny": a tenant absent from this file waits with reason "quota"

    [priority_classes.training-high]
    value = 1000000
    preemption = "PreemptLowerPriority"     # or "Never"
    preemptible = true                      # false: its running jobs are never victims
    default = false

    [cohorts.research]
    reclaim = "Any"                         # "LowerPriority" | "Never"

    [tenants.team-a]
    cohort = "research"
    priority_class = "inference-low"        # the class of this tenant's jobs that name none
    quota = { "nvidia.com/mig-2g.20gb" = 4, "nvidia.com/gpu" = 2, compute_slices = 28, memory_gib = 160 }
    borrowing_limit = { compute_slices = 14 }
    unlisted = "auto"                       # "deny" | "unlimited"

``load_tenancy(path)`` parses and validates, raising ``TenancyError`` listing every problem with its place in
the file. ``TenancyWatcher`` re-reads the file when its modification time or size changes (polled with a clock
handed in); a reload that fails validation keeps the previous configuration and reports the error.
``MIGSCHED_TENANCY_FILE`` names the file for the services and the simulator (unset: no quotas, one default
class).
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from shared.errors import MigschedError
from shared.mig.geometry import Geometry, default_geometry
from shared.policy.priority import PriorityClass, PriorityClasses
from shared.policy.quota import CohortPolicy, QuotaPolicy, TenantQuota
from shared.policy.resources import FUNGIBLE, MIG_PREFIX, is_count, is_resource

ENV_FILE = "MIGSCHED_TENANCY_FILE"
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_TOP = {"defaults", "priority_classes", "cohorts", "tenants"}
_TENANT_KEYS = {"cohort", "priority_class", "quota", "borrowing_limit", "unlisted", "description"}
_COHORT_KEYS = {"reclaim", "description"}
_CLASS_KEYS = {"value", "preemption", "preemptible", "default", "description"}
_DEFAULT_KEYS = {"unknown_tenants"}


class TenancyError(MigschedError, ValueError):
    """The tenancy file is unreadable or invalid; ``problems`` lists each one with where it is."""

    def __init__(self, origin: str, problems: list[str]) -> None:
        self.origin = origin
        self.problems = problems
        super().__init__(f"{origin}: " + ("; ".join(problems) if len(problems) == 1
                                          else f"{len(problems)} problems:\n  " + "\n  ".join(problems)))


class Tenancy:
    """A validated configuration: quota policy, priority classes and each tenant's default class."""

    __slots__ = ("classes", "quotas", "source", "tenant_classes")

    def __init__(self, quotas: QuotaPolicy | None = None, classes: PriorityClasses | None = None,
                 tenant_classes: Mapping[str, str] | None = None, source: str = "") -> None:
        self.quotas = quotas or QuotaPolicy()
        self.classes = classes or PriorityClasses()
        self.tenant_classes = dict(tenant_classes or {})
        self.source = source

    def priority_of(self, tenant: str, class_name: str | None = None) -> PriorityClass:
        """The class of a job of ``tenant`` naming ``class_name`` (or none); UnknownPriorityClassError."""
        return self.classes.resolve(class_name, self.tenant_classes.get(tenant))

    def job_priority(self, tenant: str, class_name: str | None,
                     explicit: int = 0) -> tuple[PriorityClass, int]:
        """A submitted job's class and integer priority: the class's value when the job or its tenant names a
        class; else the job's explicit ``priority`` when non-zero; else the default class's value."""
        klass = self.priority_of(tenant, class_name)
        if class_name or tenant in self.tenant_classes or explicit == 0:
            return klass, klass.value
        return klass, explicit


class TenancyDiff(msgspec.Struct, frozen=True, kw_only=True):
    """What a reload changed (for the log line and the trace); empty when nothing did."""

    tenants_added: tuple[str, ...] = ()
    tenants_removed: tuple[str, ...] = ()
    tenants_changed: tuple[str, ...] = ()
    cohorts_changed: tuple[str, ...] = ()
    classes_changed: tuple[str, ...] = ()
    default_class: tuple[str, str] | None = None

    @property
    def empty(self) -> bool:
        return not (self.tenants_added or self.tenants_removed or self.tenants_changed or self.cohorts_changed
                    or self.classes_changed or self.default_class)


def _table(raw: Any, where: str, problems: list[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be a table, got {type(raw).__name__}")
        return {}
    return raw


def _unknown(raw: dict[str, Any], allowed: set[str], where: str, problems: list[str]) -> None:
    for k in sorted(set(raw) - allowed):
        problems.append(f"{where}: unknown key {k!r}; allowed: {', '.join(sorted(allowed))}")


def _name(name: str, what: str, problems: list[str]) -> bool:
    if not _NAME.match(name):
        problems.append(f"{what} name {name!r}: use letters, digits, '-', '_' or '.', at most 63 characters")
        return False
    return True


def _amounts(raw: Any, where: str, geometry: Geometry, problems: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r, v in _table(raw, where, problems).items():
        if not is_resource(r, geometry):
            if r.startswith(MIG_PREFIX):
                known = sorted({p.name for m in geometry.models for p in m.profiles})
                close = difflib.get_close_matches(r[len(MIG_PREFIX):], known, n=3)
                hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(known)}"
                problems.append(f"{where}: unknown MIG profile {r[len(MIG_PREFIX):]!r}; {hint}")
            else:
                problems.append(f"{where}: unknown resource {r!r}; use nvidia.com/mig-<profile>, "
                                f"nvidia.com/gpu, nvidia.com/gpu.shared, {', '.join(FUNGIBLE)}")
            continue
        at = f'{where}."{r}"' if "/" in r else f"{where}.{r}"
        if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v) or math.isinf(v):
            problems.append(f"{at}: must be a number, got {v!r}")
        elif v < 0:
            problems.append(f"{at}: must not be negative, got {v}")
        elif is_count(r) and v != int(v):
            problems.append(f"{at}: a device count must be a whole number, got {v}")
        else:
            out[r] = float(v)
    return out


def parse_tenancy(text: str, origin: str = "<tenancy>", geometry: Geometry | None = None) -> Tenancy:
    """Parse and validate a tenancy TOML document. Raises TenancyError with every problem found."""
    geometry = geometry or default_geometry()
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TenancyError(origin, [f"not valid TOML: {exc}"]) from exc
    problems: list[str] = []
    _unknown(doc, _TOP, "top level", problems)
    defaults = _table(doc.get("defaults", {}), "defaults", problems)
    _unknown(defaults, _DEFAULT_KEYS, "defaults", problems)
    unknown_tenants = defaults.get("unknown_tenants", "unlimited")
    if unknown_tenants not in ("unlimited", "deny"):
        problems.append(f"defaults.unknown_tenants: must be 'unlimited' or 'deny', got {unknown_tenants!r}")
        unknown_tenants = "unlimited"
    classes = _classes(doc, problems)
    cohorts = _cohorts(doc, problems)
    tenants: list[TenantQuota] = []
    tenant_classes: dict[str, str] = {}
    known = ({c.name for c in classes}, {c.name for c in cohorts})
    for name, raw in _table(doc.get("tenants", {}), "tenants", problems).items():
        got = _tenant(name, raw, known, geometry, problems)
        if got is not None:
            tenants.append(got[0])
            if got[1] is not None:
                tenant_classes[name] = got[1]
    if problems:
        raise TenancyError(origin, problems)
    return Tenancy(QuotaPolicy(tenants, cohorts, unknown_tenants), PriorityClasses(classes), tenant_classes,
                   source=origin)


def _classes(doc: dict[str, Any], problems: list[str]) -> list[PriorityClass]:
    classes: list[PriorityClass] = []
    for name, raw in _table(doc.get("priority_classes", {}), "priority_classes", problems).items():
        where = f"priority_classes.{name}"
        body = _table(raw, where, problems)
        _unknown(body, _CLASS_KEYS, where, problems)
        if "value" not in body:
            problems.append(f"{where}: missing 'value' (an integer priority, higher runs first)")
            continue
        try:
            classes.append(msgspec.convert({"name": name, **body}, PriorityClass))
        except msgspec.ValidationError as exc:
            problems.append(f"{where}: {exc}")
    defaults_set = sorted(c.name for c in classes if c.default)
    if len(defaults_set) > 1:
        problems.append(f"priority_classes: more than one default class ({', '.join(defaults_set)})")
    return classes


def _cohorts(doc: dict[str, Any], problems: list[str]) -> list[CohortPolicy]:
    cohorts: list[CohortPolicy] = []
    for name, raw in _table(doc.get("cohorts", {}), "cohorts", problems).items():
        where = f"cohorts.{name}"
        body = _table(raw, where, problems)
        _unknown(body, _COHORT_KEYS, where, problems)
        if _name(name, "cohort", problems):
            try:
                cohorts.append(msgspec.convert({"name": name, **body}, CohortPolicy))
            except msgspec.ValidationError as exc:
                problems.append(f"{where}: {exc}")
    return cohorts


def _tenant(name: str, raw: Any, known: tuple[set[str], set[str]], geometry: Geometry,
            problems: list[str]) -> tuple[TenantQuota, str | None] | None:
    """One ``[tenants.<name>]`` table: its quota and its priority class (None: none or unknown), or None when
    its name is not valid. ``known``: the priority classes' and the cohorts' names."""
    class_names, cohort_names = known
    where = f"tenants.{name}"
    body = _table(raw, where, problems)
    _unknown(body, _TENANT_KEYS, where, problems)
    if not _name(name, "tenant", problems):
        return None
    cohort = body.get("cohort")
    if cohort is not None and (not isinstance(cohort, str) or cohort not in cohort_names):
        listed = ", ".join(sorted(cohort_names)) or "none defined; add a [cohorts.<name>] table"
        problems.append(f"{where}.cohort: unknown cohort {cohort!r}; known: {listed}")
        cohort = None
    klass = body.get("priority_class")
    if klass is not None and klass not in class_names:
        problems.append(f"{where}.priority_class: unknown priority class {klass!r}; "
                        f"known: {', '.join(sorted(class_names)) or 'none defined'}")
        klass = None
    quota = _amounts(body.get("quota", {}), f"{where}.quota", geometry, problems)
    borrowing = None
    if "borrowing_limit" in body:
        borrowing = _amounts(body["borrowing_limit"], f"{where}.borrowing_limit", geometry, problems)
        if body.get("cohort") is None:
            problems.append(f"{where}.borrowing_limit: a tenant borrows only within a cohort")
    unlisted = body.get("unlisted", "auto")
    if unlisted not in ("auto", "deny", "unlimited"):
        problems.append(f"{where}.unlisted: must be 'auto', 'deny' or 'unlimited', got {unlisted!r}")
        unlisted = "auto"
    quota_ = TenantQuota(name=name, cohort=cohort, quota=quota, borrowing_limit=borrowing, unlisted=unlisted)
    return quota_, klass


def load_tenancy(path: str | Path, geometry: Geometry | None = None) -> Tenancy:
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TenancyError(str(p), [f"cannot read the tenancy file: {exc}"]) from exc
    return parse_tenancy(text, str(p), geometry)


def tenancy_from_env(geometry: Geometry | None = None) -> Tenancy:
    """The configuration named by MIGSCHED_TENANCY_FILE (unset or empty: no quotas, the built-in class)."""
    path = os.environ.get(ENV_FILE)
    return load_tenancy(path, geometry) if path else Tenancy(source="(none)")


def diff(old: Tenancy, new: Tenancy) -> TenancyDiff:
    ot, nt = old.quotas.tenants, new.quotas.tenants
    changed = tuple(sorted(t for t in set(ot) & set(nt)
                           if ot[t] != nt[t] or old.tenant_classes.get(t) != new.tenant_classes.get(t)))
    oc, nc = old.quotas.cohorts, new.quotas.cohorts
    ok, nk = old.classes.by_name, new.classes.by_name
    dflt = (old.classes.default.name, new.classes.default.name)
    return TenancyDiff(
        tenants_added=tuple(sorted(set(nt) - set(ot))), tenants_removed=tuple(sorted(set(ot) - set(nt))),
        tenants_changed=changed,
        cohorts_changed=tuple(sorted(c for c in set(oc) | set(nc) if oc.get(c) != nc.get(c))),
        classes_changed=tuple(sorted(c for c in set(ok) | set(nk) if ok.get(c) != nk.get(c))),
        default_class=dflt if dflt[0] != dflt[1] else None,
    )


class Reload(msgspec.Struct, frozen=True, kw_only=True):
    """One reload attempt: ``ok`` with what changed, or the error while the previous config stays in force."""

    ok: bool
    at: float
    diff: TenancyDiff | None = None
    error: str = ""


class TenancyWatcher:
    """Keeps ``current`` in step with a tenancy file. ``poll()`` is cheap (one stat at most every interval);
    call it from the service's loop or a timer. The first load raises: a service must not start without it."""

    def __init__(self, path: str | Path, clock: Callable[[], float], interval_s: float = 2.0,
                 geometry: Geometry | None = None) -> None:
        self.path = Path(path)
        self.clock = clock
        self.interval_s = interval_s
        self.geometry = geometry
        self.current = load_tenancy(self.path, geometry)
        self.error = ""
        self._stamp = self._stat()
        self._next = clock() + interval_s

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def poll(self, force: bool = False) -> Reload | None:
        """None when it is not time yet or the file did not change; a Reload otherwise."""
        now = self.clock()
        if not force and now < self._next:
            return None
        self._next = now + self.interval_s
        stamp = self._stat()
        if not force and stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            new = load_tenancy(self.path, self.geometry)
        except TenancyError as exc:
            self.error = str(exc)
            return Reload(ok=False, at=now, error=self.error)
        change = diff(self.current, new)
        self.current = new
        self.error = ""
        return Reload(ok=True, at=now, diff=change)
