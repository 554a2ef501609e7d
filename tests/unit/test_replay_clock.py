"""A stack that replays a trace S times faster runs the policy on the replay's clock: its timers divided by S,
and the time alignment's minute too, so that it decides as the simulator does on trace time."""

from __future__ import annotations

import pytest

from migsched.stack import replay_timers
from services.balancer.service import placement_policy
from shared.settings import BalancerSettings, SettingsError, load

pytestmark = pytest.mark.unit


def test_a_replay_divides_every_policy_timer_and_the_alignment_minute_by_its_speed_up() -> None:
    timers = replay_timers(2000.0)
    assert float(timers["MIGSCHED_ALIGN_MINUTE_S"]) == pytest.approx(60.0 / 2000)
    assert float(timers["MIGSCHED_RESERVE_AFTER_S"]) == pytest.approx(BalancerSettings.reserve_after_s / 2000)
    assert float(timers["MIGSCHED_COOLDOWN_S"]) == pytest.approx(120.0 / 2000)


def test_the_balancer_hands_its_alignment_minute_to_the_default_policy() -> None:
    _, policy = placement_policy(load(BalancerSettings, env={"MIGSCHED_ALIGN_MINUTE_S": "0.03"}))
    assert policy is not None and policy.align_params.minute_s == 0.03  # type: ignore[attr-defined]
    _, default = placement_policy(load(BalancerSettings, env={}))
    assert default.align_params.minute_s == 60.0  # type: ignore[union-attr]


@pytest.mark.parametrize("value", ["0", "-1"])
def test_an_alignment_minute_that_is_not_positive_is_refused(value: str) -> None:
    with pytest.raises(SettingsError, match="MIGSCHED_ALIGN_MINUTE_S"):
        load(BalancerSettings, env={"MIGSCHED_ALIGN_MINUTE_S": value})
