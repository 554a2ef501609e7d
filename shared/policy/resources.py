"""The resources a quota names and an amount of them (``Usage``).

- ``nvidia.com/mig-<profile>``: a count of MIG instances of that profile;
- ``nvidia.com/gpu``: a count of whole GPUs (non-MIG GPUs, or MIG GPUs taken whole by a ``gpus: n`` job);
- ``nvidia.com/gpu.shared``: a count of time-sliced shares;
- ``compute_slices`` and ``memory_gib``: fungible amounts every job is charged in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from shared.mig.geometry import Geometry

MIG_PREFIX = "nvidia.com/mig-"
GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
COMPUTE = "compute_slices"
MEMORY = "memory_gib"
FUNGIBLE = (COMPUTE, MEMORY)
DEVICE_COUNTS = (GPU, SHARED)
EPS = 1e-6
"""Amounts closer than this compare equal."""
DIGITS = 6
"""Amounts are rounded to this many decimals, so that a charge and its uncharge cancel exactly."""


def is_count(resource: str) -> bool:
    """Device counts are integers; fungible limits may be fractional."""
    return resource not in FUNGIBLE


def is_resource(resource: str, geometry: Geometry | None = None) -> bool:
    """True for a resource a quota may name (MIG profile names checked against ``geometry`` when given)."""
    if resource in FUNGIBLE or resource in DEVICE_COUNTS:
        return True
    if not resource.startswith(MIG_PREFIX) or len(resource) == len(MIG_PREFIX):
        return False
    if geometry is None:
        return True
    name = resource[len(MIG_PREFIX):]
    return any(m.has_profile(name) for m in geometry.models)


class Usage(Mapping[str, float]):
    """An immutable amount per resource; missing = 0. Values are rounded to 1e-6 so that sums of GiB compare
    exactly after a charge and its uncharge."""

    __slots__ = ("_d", "_h")

    def __init__(self, amounts: Mapping[str, float] | Iterable[tuple[str, float]] = ()) -> None:
        items = amounts.items() if isinstance(amounts, Mapping) else amounts
        d: dict[str, float] = {}
        for k, v in items:
            x = round(float(v), DIGITS)
            if x != 0:
                d[k] = d.get(k, 0.0) + x
        self._d = d
        self._h: int | None = None

    def __getitem__(self, key: str) -> float:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        if self._h is None:
            self._h = hash(frozenset(self._d.items()))
        return self._h

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Usage):
            return self._d == other._d
        return isinstance(other, Mapping) and self._d == {k: v for k, v in other.items() if v != 0}

    def __repr__(self) -> str:
        return "Usage(" + ", ".join(f"{k}={v:g}" for k, v in sorted(self._d.items())) + ")"

    def amount(self, resource: str) -> float:
        return self._d.get(resource, 0.0)

    def __add__(self, other: Mapping[str, float]) -> Usage:
        d = dict(self._d)
        for k, v in other.items():
            d[k] = round(d.get(k, 0.0) + v, DIGITS)
        return Usage(d)

    def __sub__(self, other: Mapping[str, float]) -> Usage:
        d = dict(self._d)
        for k, v in other.items():
            d[k] = round(d.get(k, 0.0) - v, DIGITS)
        return Usage(d)

    def scaled(self, n: float) -> Usage:
        return Usage({k: v * n for k, v in self._d.items()})

    def negative(self) -> tuple[str, ...]:
        return tuple(k for k, v in self._d.items() if v < -EPS)

    def to_dict(self) -> dict[str, float]:
        return dict(sorted(self._d.items()))


EMPTY = Usage()
