"""Named priority classes (Kubernetes ``PriorityClass`` semantics plus a "cannot be preempted" flag).

A job names a class (or inherits its tenant's, or the default one); the class gives the job its integer
priority (higher runs first and may preempt lower) and two policies:

- ``preemption``: ``PreemptLowerPriority`` lets the job's admission preempt strictly lower-priority work;
  ``Never`` makes the job wait instead (it still jumps ahead of lower priorities in the queue).
- ``preemptible``: False protects the class's running jobs from ever being chosen as victims, whatever the
  priority of the job that wants their room (an SLO-bound service, a job that cannot checkpoint).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Annotated, Literal

import msgspec

from shared.errors import RequestError

PreemptionPolicy = Literal["PreemptLowerPriority", "Never"]
ClassName = Annotated[str, msgspec.Meta(min_length=1, max_length=63,
                                        pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")]
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1


class UnknownPriorityClassError(RequestError):
    """A job names a priority class that the tenancy configuration does not define."""


class PriorityClass(msgspec.Struct, frozen=True, kw_only=True):
    name: ClassName
    value: Annotated[int, msgspec.Meta(ge=PRIORITY_MIN, le=PRIORITY_MAX)]
    preemption: PreemptionPolicy = "PreemptLowerPriority"
    preemptible: bool = True
    default: bool = False
    description: Annotated[str, msgspec.Meta(max_length=512)] = ""

    @property
    def may_preempt(self) -> bool:
        return self.preemption == "PreemptLowerPriority"


BUILTIN_DEFAULT = PriorityClass(name="default", value=0, default=True,
                                description="used when no class is configured as default")


class PriorityClasses:
    """An immutable, validated set of classes with one default (else the built-in ``default``, value 0)."""

    __slots__ = ("by_name", "default")

    def __init__(self, classes: Iterable[PriorityClass] = ()) -> None:
        by_name: dict[str, PriorityClass] = {}
        for c in classes:
            by_name[c.name] = c
        defaults = [c for c in by_name.values() if c.default]
        if len(defaults) > 1:
            names = ", ".join(sorted(c.name for c in defaults))
            raise RequestError(f"more than one default priority class: {names}")
        self.default: PriorityClass = defaults[0] if defaults else by_name.get("default", BUILTIN_DEFAULT)
        self.by_name: Mapping[str, PriorityClass] = MappingProxyType(by_name)

    def __len__(self) -> int:
        return len(self.by_name)

    def __iter__(self) -> Iterator[PriorityClass]:
        return iter(sorted(self.by_name.values(), key=lambda c: (-c.value, c.name)))

    def get(self, name: str) -> PriorityClass:
        found = self.by_name.get(name)
        if found is None:
            if name == self.default.name:
                return self.default
            known = ", ".join(sorted(self.by_name)) or "(none configured)"
            raise UnknownPriorityClassError(f"unknown priority class {name!r}; known: {known}")
        return found

    def resolve(self, name: str | None, tenant_default: str | None = None) -> PriorityClass:
        """The class of a job: its own, else its tenant's default class, else the global default."""
        if name:
            return self.get(name)
        if tenant_default:
            return self.get(tenant_default)
        return self.default

    def of_value(self, value: int) -> PriorityClass | None:
        """The class with this value (for a running job that carries only its integer priority); the one with
        the lowest name when several share it."""
        hits = sorted((c for c in self.by_name.values() if c.value == value), key=lambda c: c.name)
        return hits[0] if hits else None
