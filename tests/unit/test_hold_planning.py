"""The balancer's holds of one shard: planned anew by each backfill pass, in its order; seen by every decision
until the next pass; dropped when their job is placed."""

from __future__ import annotations

import pytest

from services.balancer.holds import Holds
from shared.events import Demand, JobSubmit
from shared.mig.geometry import default_geometry
from shared.policy.reservation import ReservationParams, due
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of
from shared.settings import BalancerSettings, SettingsError, load

pytestmark = pytest.mark.unit
GEO = default_geometry()


def _snap() -> ClusterSnapshot:
    def busy(gid: str, ends: float) -> GpuView:
        return GpuView.build(id=gid, node="n1", index=int(gid[-1]), model="A100-40GB", instances=[InstanceView(
            id=f"{gid}/i", profile="4g.20gb", start=0, size=4, compute=4, job_id=f"{gid}/j", ends_at=ends)])
    return snapshot_of(GEO, [busy("n1/0", 5000.0), busy("n1/1", 200.0)])


def _sub(job: str, profile: str, at: float = 0.0, patience: float | None = None) -> JobSubmit:
    return JobSubmit(id=f"s-{job}", job_id=job, demand=Demand(kind="mig", profile=profile), submitted_at=at,
                     patience_s=patience)


def test_a_pass_holds_the_gpu_that_frees_first_and_later_decisions_see_it() -> None:
    h = Holds(ReservationParams(after_s=0.0))
    h.begin()
    r = h.consider(_snap(), _sub("big", "7g.40gb"), now=100.0)
    assert r is not None and r.gpus == ("n1/1",) and r.start == 200.0
    assert h.blocked("other", 500.0, now=100.0) == {"n1/1"}  # would end at 600, after the hold starts
    assert h.blocked("other", 50.0, now=100.0) == set()  # ends at 150: may use it
    assert h.blocked("big", None, now=100.0) == set()  # its own hold
    assert h.end() == [r]
    assert h.blocked("other", None, now=120.0) == {"n1/1"}  # fresh submits see the last pass's holds


def test_with_slack_a_job_ending_that_little_after_the_hold_may_use_its_gpu() -> None:
    h = Holds(ReservationParams(after_s=0.0, slack_s=300.0))
    h.begin()
    r = h.consider(_snap(), _sub("big", "7g.40gb"), now=100.0)
    assert r is not None and r.start == 200.0
    assert h.blocked("other", 400.0, now=100.0) == set()  # ends at 500: 300 s past the start, within the slack
    assert h.blocked("other", 401.0, now=100.0) == {"n1/1"}
    assert h.blocked("other", None, now=100.0) == {"n1/1"}  # no hint, no way in


def test_a_negative_slack_is_refused() -> None:
    with pytest.raises(SettingsError, match="MIGSCHED_RESERVE_SLACK_S"):
        load(BalancerSettings, env={"MIGSCHED_RESERVE_SLACK_S": "-1"})
    assert load(BalancerSettings, env={"MIGSCHED_RESERVE_SLACK_S": "900"}).reserve_slack_s == 900.0


def test_a_negative_default_hint_is_refused_and_none_is_the_default() -> None:
    with pytest.raises(SettingsError, match="MIGSCHED_DEFAULT_HINT_S"):
        load(BalancerSettings, env={"MIGSCHED_DEFAULT_HINT_S": "-60"})
    assert load(BalancerSettings, env={}).default_hint_s == 0.0
    assert load(BalancerSettings, env={"MIGSCHED_DEFAULT_HINT_S": "14400"}).default_hint_s == 14400.0


def test_only_large_jobs_get_holds_and_never_outside_a_pass_or_past_patience() -> None:
    h = Holds(ReservationParams(after_s=0.0))
    assert h.consider(_snap(), _sub("big", "7g.40gb"), now=100.0) is None  # no pass running
    h.begin()
    assert h.consider(_snap(), _sub("small", "3g.20gb"), now=100.0) is None
    assert h.consider(_snap(), _sub("late", "7g.40gb", at=0.0, patience=150.0), now=100.0) is None
    assert h.end() == []


def test_a_placed_job_gives_its_hold_back_and_the_next_pass_starts_afresh() -> None:
    h = Holds(ReservationParams(after_s=0.0, max_held=1))
    h.begin()
    assert h.consider(_snap(), _sub("a", "7g.40gb"), now=0.0) is not None
    assert h.consider(_snap(), _sub("b", "7g.40gb"), now=0.0) is None  # one hold at most
    h.end()
    h.placed("a")
    assert h.current == [] and h.blocked("x", None, 0.0) == set()


def test_a_job_that_fits_on_one_node_is_held_only_once_it_has_waited_and_a_gang_across_nodes_at_once() -> None:
    h = Holds(ReservationParams(after_s=600.0))
    h.begin()
    assert h.consider(_snap(), _sub("big", "7g.40gb", at=0.0), now=599.0) is None  # competes as any job first
    r = h.consider(_snap(), _sub("big", "7g.40gb", at=0.0), now=600.0)
    assert r is not None and r.gpus == ("n1/1",)
    assert due(ReservationParams(after_s=600.0), waited_s=0.0, spans_nodes=True)  # a gang bigger than a node
    assert not due(ReservationParams(after_s=600.0), waited_s=599.0, spans_nodes=False)
