"""The keep-or-destroy policy for idle instances, and its sliding window of recent demand."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.policy.retention import RecentDemand, RetentionParams, demand_instant, keep_idle, keeps_idle

pytestmark = pytest.mark.unit
P = RetentionParams(window_s=60, min_share=0.1, max_idle_same=2)


def test_a_profile_in_recent_demand_is_kept() -> None:
    r = keep_idle("3g.20gb", {"3g.20gb": 5, "1g.5gb": 5}, 0, P)
    assert r.keep and "50.0%" in r.reason


def test_a_profile_nobody_asks_for_is_destroyed() -> None:
    assert not keep_idle("7g.40gb", {"1g.5gb": 30, "7g.40gb": 1}, 0, P).keep
    assert not keep_idle("1g.5gb", {}, 0, P).keep


def test_a_gpu_keeps_at_most_a_few_idle_instances_of_one_profile() -> None:
    assert not keep_idle("1g.5gb", {"1g.5gb": 10}, 2, P).keep
    assert keep_idle("1g.5gb", {"1g.5gb": 10}, 1, P).keep


def test_the_window_forgets_old_demand() -> None:
    d = RecentDemand(window_s=60)
    d.observe("3g.20gb", 0.0)
    d.observe("1g.5gb", 30.0)
    assert dict(d.counts(59.0)) == {"3g.20gb": 1, "1g.5gb": 1}
    assert dict(d.counts(61.0)) == {"1g.5gb": 1}
    assert dict(d.counts(200.0)) == {}


def test_placements_at_one_instant_are_one_entry_and_expire_together() -> None:
    d = RecentDemand(window_s=60)
    for p in ("1g.5gb", "2g.10gb", "1g.5gb", "1g.5gb"):
        d.observe(p, 10.0)
    d.observe("1g.5gb", 20.0)
    assert len(d) == 2 and dict(d.counts(20.0)) == {"1g.5gb": 4, "2g.10gb": 1}
    assert dict(d.counts(70.5)) == {"1g.5gb": 1}  # the four of 10.0 left the window at once
    assert len(d) == 1


@given(st.lists(st.tuples(st.sampled_from(["1g.5gb", "2g.10gb", "7g.40gb"]), st.integers(0, 40)), max_size=60),
       st.integers(0, 120))
def test_the_counts_are_those_of_every_placement_inside_the_window(obs: list[tuple[str, int]], at: int) -> None:
    d = RecentDemand(window_s=30)
    times = sorted(t for _, t in obs)
    for (p, _), t in zip(obs, times, strict=True):
        d.observe(p, float(t))
    now = float(max([at, *times]))
    want = Counter(p for (p, _), t in zip(obs, times, strict=True) if t >= now - 30)
    assert dict(d.counts(now)) == dict(want)


@given(st.floats(0, 1e9), st.sampled_from([0.0, 0.15, 2.0, 300.0]))
def test_a_demand_instant_is_at_most_a_thousandth_of_the_window_early(now: float, window: float) -> None:
    at = demand_instant(now, window)
    assert at <= now and now - at <= window / 1000 + 1e-6 * max(1.0, now)


@given(st.lists(st.tuples(st.sampled_from(["1g.5gb", "2g.10gb", "7g.40gb"]), st.integers(0, 40)), max_size=60),
       st.integers(0, 120), st.sampled_from(["1g.5gb", "2g.10gb", "7g.40gb", "3g.20gb"]), st.integers(0, 3))
def test_keeps_idle_with_the_kept_total_decides_as_keep_idle(
    obs: list[tuple[str, int]], at: int, profile: str, same: int
) -> None:
    d = RecentDemand(window_s=30)
    times = sorted(t for _, t in obs)
    for (p, _), t in zip(obs, times, strict=True):
        d.observe(p, float(t))
    counts = d.counts(float(max([at, *times])))
    assert d.total == sum(counts.values())
    want = keep_idle(profile, counts, same, P).keep
    assert keeps_idle(profile, counts, same, P, d.total) is want
    assert keeps_idle(profile, counts, same, P) is want
