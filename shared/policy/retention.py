"""Keep an idle MIG instance for reuse, or destroy it? (the node registry's rule: "keep if the profile is in
recent
demand".)

Reusing an idle instance saves two reconfigurations (destroy + create, 0.1-1 s each on real GPUs); keeping one
that nobody asks for blocks other shapes until the balancer reclaims it (which costs the same reconfiguration
later, on the critical path of a placement). So: keep it when its profile made up at least ``min_share`` of
the
placements in the last ``window_s`` seconds, and the GPU does not already hold ``max_idle_same`` idle
instances
of that profile; destroy it otherwise. Pure: the caller hands in the recent demand and the time.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Mapping

import msgspec


class RetentionParams(msgspec.Struct, frozen=True, kw_only=True):
    window_s: float = 300.0
    min_share: float = 0.05
    max_idle_same: int = 2


class Retain(msgspec.Struct, frozen=True, kw_only=True):
    keep: bool
    reason: str


def keep_idle(
    profile: str, recent: Mapping[str, int], idle_same_on_gpu: int, params: RetentionParams
) -> Retain:
    """Decide for one idle instance of ``profile``; ``recent`` counts placements per profile in the window and
    ``idle_same_on_gpu`` is how many other idle instances of that profile the GPU holds."""
    total = sum(recent.values())
    if total == 0:
        return Retain(keep=False, reason="no recent demand at all")
    share = recent.get(profile, 0) / total
    if share < params.min_share:
        return Retain(
            keep=False, reason=f"{profile} is {share:.1%} of recent demand (< {params.min_share:.0%})"
        )
    if idle_same_on_gpu >= params.max_idle_same:
        return Retain(keep=False, reason=f"GPU already keeps {idle_same_on_gpu} idle {profile}")
    return Retain(keep=True, reason=f"{profile} is {share:.1%} of recent demand")


def keeps_idle(
    profile: str, recent: Mapping[str, int], idle_same_on_gpu: int, params: RetentionParams,
    total: int | None = None,
) -> bool:
    """``keep_idle(...).keep`` without building the reason (the simulator asks once per freed instance);
    ``total``: the sum of ``recent``, when the caller keeps it (``RecentDemand.total``)."""
    if total is None:
        total = sum(recent.values())
    if total == 0 or recent.get(profile, 0) / total < params.min_share:
        return False
    return idle_same_on_gpu < params.max_idle_same


def demand_instant(now: float, window_s: float) -> float:
    """``now`` rounded down to a thousandth of the window: a caller that records placements at these instants
    keeps at most ~1,000 entries in ``RecentDemand`` whatever its rate, at 0.1 % of the window's precision."""
    step = window_s / 1000
    return math.floor(now / step) * step if step > 0 else now


class RecentDemand:
    """Placements per profile over a sliding window; time is handed in (no clock here).

    Placements handed in with the same instant are kept as one entry (a counter per profile), so a caller that
    stamps a whole batch with one instant, or rounds its clock, keeps a few entries per instant instead of one
    per placement (the node registry at 1,000 placements/s held 300,000 over a 300 s window, ~25 MB)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        # per instant a plain dict, not a Counter: building a Counter costs several times more
        self._events: deque[tuple[float, dict[str, int]]] = deque()
        self._counts: Counter[str] = Counter()
        self.total = 0
        """The sum of the counts (kept, so that a reader need not add them up per question)."""

    def observe(self, profile: str, now: float) -> None:
        ev = self._events
        if ev and ev[-1][0] == now:
            last = ev[-1][1]
            last[profile] = last.get(profile, 0) + 1
        else:
            ev.append((now, {profile: 1}))
        self._counts[profile] += 1
        self.total += 1
        if ev[0][0] < now - self.window_s:  # ``_expire``'s first test, without its call when nothing expires
            self._expire(now)

    def counts(self, now: float) -> Mapping[str, int]:
        ev = self._events
        if ev and ev[0][0] < now - self.window_s:
            self._expire(now)
        return self._counts

    def __len__(self) -> int:
        """Entries kept (distinct instants within the window)."""
        return len(self._events)

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        ev = self._events
        while ev and ev[0][0] < horizon:
            _, gone = ev.popleft()
            for p, n in gone.items():
                self.total -= n
                self._counts[p] -= n
                if self._counts[p] <= 0:
                    del self._counts[p]
