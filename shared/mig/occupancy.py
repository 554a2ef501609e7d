"""Occupancy arithmetic on a GPU's memory-slice mask (bit i = memory slice i in use).

A placement is NVML's ``(start, size)`` in memory slices. The only conflict rule is interval overlap, plus each
profile's maximum instance count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence

from shared.errors import MigschedError
from shared.mig.geometry import GpuModel, Profile

Layout = tuple[tuple[str, int], ...]
"""A set of instances as sorted ``(profile name, start)`` pairs."""


class OccupancyError(MigschedError):
    """An instance was applied where it cannot go, or removed where it is not."""


def span(size: int, start: int) -> int:
    return ((1 << size) - 1) << start


def popcount(mask: int) -> int:
    return mask.bit_count()


def free_starts(profile: Profile, mask: int) -> tuple[int, ...]:
    """Legal starts of ``profile`` whose slices are all free in ``mask``."""
    size = profile.memory_slices
    return tuple(s for s in profile.placements if not mask & span(size, s))


def apply(mask: int, profile: Profile, start: int) -> int:
    if start not in profile.placements:
        raise OccupancyError(f"{profile.name} cannot start at memory slice {start}; legal: {profile.placements}")
    pm = span(profile.memory_slices, start)
    if mask & pm:
        raise OccupancyError(f"{profile.name}@{start} overlaps occupied slices {mask:08b}")
    return mask | pm


def remove(mask: int, profile: Profile, start: int) -> int:
    pm = span(profile.memory_slices, start)
    if mask & pm != pm:
        raise OccupancyError(f"{profile.name}@{start} is not present in {mask:08b}")
    return mask & ~pm


def layout_mask(model: GpuModel, layout: Iterable[tuple[str, int]]) -> int:
    mask = 0
    for name, start in layout:
        mask = apply(mask, model.profile(name), start)
    return mask


def _options(profiles: Sequence[Profile]) -> list[tuple[Profile, int, int]]:
    return [(p, s, span(p.memory_slices, s)) for p in profiles for s in p.placements]


def enumerate_layouts(
    model: GpuModel,
    profiles: Sequence[Profile] | None = None,
    base_mask: int = 0,
    base_counts: Mapping[str, int] | None = None,
) -> Iterator[Layout]:
    """Every non-empty set of new instances that fits beside ``base_mask`` (max counts respected)."""
    opts = _options(profiles if profiles is not None else model.profiles)
    counts: Counter[str] = Counter(base_counts or {})

    def rec(i: int, mask: int, chosen: list[tuple[str, int]]) -> Iterator[Layout]:
        for j in range(i, len(opts)):
            p, s, pm = opts[j]
            if mask & pm or counts[p.name] >= p.max_count:
                continue
            chosen.append((p.name, s))
            counts[p.name] += 1
            yield tuple(sorted(chosen))
            yield from rec(j + 1, mask | pm, chosen)
            counts[p.name] -= 1
            chosen.pop()

    yield from rec(0, base_mask, [])


def can_add(
    model: GpuModel, profiles: Sequence[Profile], mask: int, counts: Mapping[str, int]
) -> bool:
    """True when some instance of ``profiles`` still fits (placement free and count below max)."""
    return any(counts.get(p.name, 0) < p.max_count and free_starts(p, mask) for p in profiles)


def maximal_layouts(
    model: GpuModel,
    profiles: Sequence[Profile] | None = None,
    base_mask: int = 0,
    base_counts: Mapping[str, int] | None = None,
) -> list[Layout]:
    """The maximal packings: layouts beside ``base_mask`` to which no further instance can be added."""
    profs = list(profiles if profiles is not None else model.profiles)
    out: list[Layout] = []
    for layout in enumerate_layouts(model, profs, base_mask, base_counts):
        mask = base_mask
        counts: Counter[str] = Counter(base_counts or {})
        for name, start in layout:
            mask |= span(model.profile(name).memory_slices, start)
            counts[name] += 1
        if not can_add(model, profs, mask, counts):
            out.append(layout)
    return out


def fit_mix(
    model: GpuModel, mix: Mapping[str, int], base_mask: int = 0, base_counts: Mapping[str, int] | None = None
) -> Layout | None:
    """One legal layout placing exactly the multiset ``mix`` beside ``base_mask``, or None.

    Largest instances first, lowest start first; backtracking makes the answer exact, not greedy.
    """
    wanted: list[Profile] = []
    for name, n in mix.items():
        if n < 0:
            raise OccupancyError(f"negative count for {name}")
        wanted.extend([model.profile(name)] * n)
    wanted.sort(key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
    counts: Counter[str] = Counter(base_counts or {})
    for p in set(wanted):
        if counts[p.name] + sum(1 for w in wanted if w.name == p.name) > p.max_count:
            return None
    chosen: list[tuple[str, int]] = []

    def rec(i: int, mask: int, min_start: int) -> bool:
        if i == len(wanted):
            return True
        p = wanted[i]
        # identical consecutive profiles take increasing starts, so each multiset is tried once
        lo = min_start if i > 0 and wanted[i - 1].name == p.name else -1
        for s in free_starts(p, mask):
            if s <= lo:
                continue
            chosen.append((p.name, s))
            if rec(i + 1, mask | span(p.memory_slices, s), s):
                return True
            chosen.pop()
        return False

    return tuple(sorted(chosen, key=lambda x: x[1])) if rec(0, base_mask, -1) else None


def draw(model: GpuModel, layout: Iterable[tuple[str, int]], labels: Sequence[str] | None = None) -> str:
    """One text row of the memory slices, e.g. ``[  3g.20gb  ][2g.10gb][ . ]``: who holds which slice.

    ``labels`` (one per instance, default the profile name) lets callers show job ids instead.
    """
    owner: list[int] = [-1] * model.memory_slices
    items = list(layout)
    for k, (name, start) in enumerate(items):
        for i in range(model.profile(name).memory_slices):
            owner[start + i] = k
    out: list[str] = []
    i = 0
    while i < model.memory_slices:
        j = i
        while j + 1 < model.memory_slices and owner[i] >= 0 and owner[j + 1] == owner[i]:
            j += 1
        width = (j - i + 1) * 8 - 1
        label = "." if owner[i] < 0 else labels[owner[i]] if labels is not None else items[owner[i]][0]
        out.append("[" + label[:width].center(width) + "]")
        i = j + 1
    return "".join(out)
