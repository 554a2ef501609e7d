"""The planner's after-exit passes back off while they find nothing to move."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.migration_planner.pacing import next_wait

pytestmark = pytest.mark.unit


def test_each_fruitless_pass_doubles_the_wait_up_to_the_cap() -> None:
    assert [next_wait(k, 0.5, 4.0) for k in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_cap_no_longer_than_the_base_means_no_back_off() -> None:
    assert {next_wait(k, 0.5, 0.5) for k in range(10)} == {0.5}
    assert next_wait(7, 0.5, 0.1) == 0.5


@given(st.integers(-5, 10_000), st.floats(0.01, 10), st.floats(0.01, 100))
def test_the_wait_is_never_shorter_than_the_base_nor_longer_than_the_larger_of_base_and_cap(
    fruitless: int, base: float, cap: float
) -> None:
    wait = next_wait(fruitless, base, cap)
    assert base <= wait <= max(base, cap)
    assert next_wait(fruitless + 1, base, cap) >= wait
