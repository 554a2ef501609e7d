"""With a tenancy file the balancer places through its mirror's index as it does without one: a job the index can
answer is placed where the policy over the snapshot would place it, without calling the policy."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
from mig_strategies import GEO, random_cluster

from services.balancer.candidate import Candidate
from services.balancer.decide import Decider, DecisionMetrics
from services.balancer.shards import Shards
from services.balancer.tenancy import TenantLedger
from shared.events import Demand, JobSubmit
from shared.policy.admission import Hold, Start
from shared.policy.placement.balancer import BalancerParams
from shared.policy.placement.decision import JobRequest
from shared.policy.placement.registry import get_policy
from shared.policy.reservation import ReservationParams
from tests.unit.test_balancer_mirror_decisions import stored

pytestmark = pytest.mark.unit
NOW = 10_000.0


class Counted:
    """The ``migsched`` policy, counting the calls it answers itself (its index parameters passed through)."""

    def __init__(self) -> None:
        self.inner = get_policy("migsched")[1]
        self.align_params = self.inner.align_params  # type: ignore[attr-defined]
        self.calls = 0

    def __call__(self, snap: Any, job: JobRequest) -> Any:
        self.calls += 1
        return self.inner(snap, job)


def decider(tmp_path: Path, quota: str = "") -> tuple[Decider, Counted]:
    path = tmp_path / "tenancy.toml"
    path.write_text('[priority_classes.normal]\nvalue = 100\ndefault = true\n\n[tenants.team]\n' + quota)
    ledger = TenantLedger(str(path), 0, poll_s=0.0, geometry=GEO)
    shards = Shards(1, GEO, ReservationParams(), ledger)
    for g in random_cluster(random.Random(5), 48, ("A100-40GB", "H100-80GB"), odd_share=0.0).gpus:
        shards.mirrors[0].put(stored(g))
    ledger.rebuild([shards.mirrors[0].snapshot()])
    policy = Counted()
    return Decider(shards, ledger, BalancerParams(), policy, True, GEO, DecisionMetrics()), policy  # type: ignore[arg-type]


def candidate(job: str, profile: str) -> Candidate:
    sub = JobSubmit(id=f"s-{job}", job_id=job, demand=Demand(kind="mig", profile=profile), tenant="team",
                    duration_hint_s=900.0, submitted_at=NOW - 5)
    return Candidate(submit=sub, spec=msgspec.json.encode(sub), ctx=None)


@pytest.mark.parametrize("profile", ["1g", "2g", "3g", "4g"])
def test_a_tenants_job_is_placed_through_the_index_where_the_policy_would_place_it(
    tmp_path: Path, profile: str
) -> None:
    d, policy = decider(tmp_path)
    c = candidate("j", profile)
    got = d._admit(0, c, frozenset(), {}, NOW)
    assert not isinstance(got, str) and isinstance(got[2], Start)
    assert policy.calls == 0
    req = JobRequest(job_id="j", demand=c.submit.demand, tenant="team", priority=got[1], duration_hint_s=900.0,
                     now=NOW, submitted_at=NOW - 5)
    assert got[2].placement.slots == policy.inner(d.shards.mirrors[0].snapshot(), req).slots


def test_a_tenant_over_its_quota_is_held_before_any_placement(tmp_path: Path) -> None:
    d, policy = decider(tmp_path, "quota = { compute_slices = 1 }\n")
    got = d._admit(0, candidate("j", "3g"), frozenset(), {}, NOW)
    assert not isinstance(got, str) and isinstance(got[2], Hold) and got[2].reason == "quota"
    assert policy.calls == 0
