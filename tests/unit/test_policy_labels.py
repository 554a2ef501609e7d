"""``MIGSCHED_POLICY`` takes a policy with its parameters, as ``migsched simulate -p`` does
(``migsched[keep_empty=0]``): the balancer places with them, and the balancer and the migration planner read
what the label turns on or off (holds, moves)."""

from __future__ import annotations

import re

import pytest

from services.balancer.service import placement_policy
from shared.mig.geometry import default_geometry
from shared.policy.gpu_view import GpuView, InstanceView
from shared.policy.placement.decision import JobRequest, Placement
from shared.policy.placement.registry import get_labelled
from shared.policy.request import Demand
from shared.policy.snapshot import snapshot_of
from shared.settings import BalancerSettings, MigrationPlannerSettings, SettingsError, load

pytestmark = pytest.mark.unit
GEO = default_geometry()


def _settings(policy: str) -> BalancerSettings:
    return load(BalancerSettings, env={"MIGSCHED_POLICY": policy})


def test_a_label_gives_the_policy_its_parameters_over_the_balancers_own() -> None:
    _, policy = placement_policy(_settings("migsched[keep_empty=0,top_k=1]"))
    align = policy.align_params  # type: ignore[union-attr]
    assert (align.keep_empty, align.top_k, align.minute_s) == (0.0, 1, 60.0)


def test_a_balancer_told_to_spread_opens_an_empty_gpu_where_the_default_packs() -> None:
    running = InstanceView(id="n/0/i0", profile="3g.20gb", start=4, size=4, compute=3, job_id="r", ends_at=600.0)
    snap = snapshot_of(GEO, [GpuView.build(id="n/0", node="n", index=0, model="A100-40GB", instances=[running]),
                             GpuView.build(id="n/1", node="n", index=1, model="A100-40GB")])
    job = JobRequest(job_id="a", demand=Demand(kind="mig", profile="1g"), duration_hint_s=600.0, now=0.0)
    chosen = {}
    for label in ("migsched", "migsched[keep_empty=0]"):
        _, policy = placement_policy(_settings(label))
        placed = policy(snap, job)  # type: ignore[misc]
        assert isinstance(placed, Placement)
        chosen[label] = placed.slots[0].gpu_id
    assert chosen == {"migsched": "n/0", "migsched[keep_empty=0]": "n/1"}


def test_what_a_label_turns_off_or_on_is_what_the_services_read() -> None:
    assert get_labelled("migsched")[0].reserves and not get_labelled("migsched[reserve=off]")[0].reserves
    assert get_labelled("first-fit[reserve=on]")[0].reserves and not get_labelled("migsched")[0].migrates


@pytest.mark.parametrize("cls", [BalancerSettings, MigrationPlannerSettings])
@pytest.mark.parametrize(("label", "why"), [
    ("migsched[bogus=1]", "takes no parameter(s) bogus"),
    ("migsched[keep_empty=-1]", "Expected `float` >= 0.0"),
    ("nosuch[keep_empty=0]", "unknown policy 'nosuch'"),
])
def test_a_label_the_policy_does_not_take_stops_the_service_at_start_with_the_reason(
    cls: type, label: str, why: str
) -> None:
    with pytest.raises(SettingsError, match=re.escape(f"MIGSCHED_POLICY={label!r}: ") + ".*" + re.escape(why)):
        load(cls, env={"MIGSCHED_POLICY": label})
