"""Whether a move can pay off, from the job's duration hint (shared.policy.migration.payoff)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.policy.migration.payoff import pays_off, time_left

pytestmark = pytest.mark.unit


def test_the_time_left_is_the_hint_less_what_the_job_has_run() -> None:
    assert time_left(100.0, started_at=1_000.0, now=1_030.0) == 70.0


def test_a_job_that_has_not_started_has_its_whole_hint_left() -> None:
    assert time_left(100.0, started_at=0.0, now=1_030.0) == 100.0


def test_a_job_past_its_hint_has_nothing_left_and_no_hint_means_unknown() -> None:
    assert time_left(10.0, started_at=1_000.0, now=1_030.0) == 0.0
    assert time_left(None, started_at=1_000.0, now=1_030.0) is None


def test_a_job_ending_within_the_minimum_is_not_worth_moving_and_others_are() -> None:
    assert not pays_off(29.9, 30.0)
    assert pays_off(30.0, 30.0)
    assert pays_off(None, 30.0)  # no hint: nothing says it ends soon
    assert pays_off(0.0, 0.0)  # a minimum of 0 moves any job


@given(st.floats(0, 1e6), st.floats(0, 1e6), st.floats(0, 1e6), st.floats(0, 1e3))
def test_a_longer_hint_never_makes_a_move_less_worth_it(hint: float, more: float, ran: float, minimum: float) -> None:
    now = 2e6
    short, long_ = time_left(hint, now - ran, now), time_left(hint + more, now - ran, now)
    assert short is not None and long_ is not None and long_ >= short
    assert pays_off(long_, minimum) or not pays_off(short, minimum)
