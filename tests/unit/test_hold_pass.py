"""The holds one queue pass plans (``HoldPass``): the rule the simulator's pass and the balancer's share."""

from __future__ import annotations

import math

import pytest

from shared.mig.geometry import default_geometry
from shared.policy.hold_pass import HoldPass, closed_by
from shared.policy.reservation import ReservationParams
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of

pytestmark = pytest.mark.unit
GEO = default_geometry()


def _snap(*ends: float) -> ClusterSnapshot:
    """One node, one GPU per expected end, each running a 4g until then."""
    return snapshot_of(GEO, [GpuView.build(id=f"n1/{k}", node="n1", index=k, model="A100-40GB", instances=[
        InstanceView(id=f"n1/{k}/i", profile="4g.20gb", start=0, size=4, compute=4, job_id=f"j{k}", ends_at=end)])
        for k, end in enumerate(ends)])


def test_a_later_hold_of_the_pass_plans_around_the_gpus_an_earlier_one_took() -> None:
    p = HoldPass(ReservationParams(after_s=0.0))
    snap = _snap(300.0, 100.0, 200.0)
    first = p.plan(snap, "a", 1, 0.0, math.inf)
    assert first is not None and first.gpus == ("n1/1",)
    p.add(first)
    second = p.plan(snap, "b", 1, 0.0, math.inf)
    assert second is not None and second.gpus == ("n1/2",) and second.start == 200.0


def test_a_pass_holds_at_most_max_held_jobs_from_at_most_twice_as_many_plans() -> None:
    p = HoldPass(ReservationParams(after_s=0.0, max_held=2))
    snap = _snap(100.0, 200.0, 300.0, 400.0, 500.0)
    assert p.wants(1, 0.0, False)
    for job in ("a", "b", "c"):  # plans that found nothing in time still count
        assert p.plan(snap, job, 1, 0.0, 50.0) is None
    assert p.wants(1, 0.0, False)
    assert p.plan(snap, "d", 1, 0.0, 50.0) is None
    assert not p.wants(1, 0.0, False)  # four plans made: no more this pass

    q = HoldPass(ReservationParams(after_s=0.0, max_held=2))
    for job in ("a", "b"):
        r = q.plan(snap, job, 1, 0.0, math.inf)
        assert r is not None
        q.add(r)
    assert not q.wants(1, 0.0, False)  # two held: no more this pass


def test_only_a_due_large_job_is_wanted() -> None:
    p = HoldPass(ReservationParams(after_s=600.0))
    assert not p.wants(0, 10_000.0, False)  # not a large job
    assert not p.wants(1, 599.0, False)  # fits on one node and has not waited long enough
    assert p.wants(1, 600.0, False)
    assert p.wants(16, 0.0, True)  # a gang bigger than every node is held at once


def test_a_job_placed_mid_pass_gives_its_gpus_back_to_later_holds() -> None:
    p = HoldPass(ReservationParams(after_s=0.0))
    snap = _snap(100.0, 200.0)
    r = p.plan(snap, "a", 1, 0.0, math.inf)
    assert r is not None
    p.add(r)
    p.drop("a")
    assert p.held == [] and p.taken == set()
    again = p.plan(snap, "b", 1, 0.0, math.inf)
    assert again is not None and again.gpus == r.gpus


def test_a_job_may_use_a_held_gpu_only_when_it_ends_before_the_hold_starts_and_never_its_own() -> None:
    p = HoldPass(ReservationParams(after_s=0.0))
    r = p.plan(_snap(100.0), "a", 1, 0.0, math.inf)
    assert r is not None
    p.add(r)
    assert p.blocking(100.0, now=0.0) == set()  # ends at the start
    assert p.blocking(101.0, now=0.0) == {"n1/0"}
    assert p.blocking(None, now=0.0) == {"n1/0"}  # no hint, no way in
    assert p.blocking(None, now=0.0, job_id="a") == set()


def test_a_job_kept_off_held_gpus_is_told_which_hold_and_why() -> None:
    p = HoldPass(ReservationParams(after_s=0.0))
    r = p.plan(_snap(100.0, 5000.0), "big", 1, 0.0, math.inf)
    assert r is not None
    p.add(r)
    assert closed_by(p.held, 50.0, now=0.0) is None  # it ends first: nothing is closed to it
    assert closed_by(p.held, None, now=0.0, job_id="big") is None  # its own hold
    assert closed_by(p.held, 500.0, now=40.0) == (
        "1 GPU(s) held for big (expected start in 60 s) are closed to it: its hint (500 s) ends after that")
    assert closed_by(p.held, None, now=0.0, slack_s=30.0) == (
        "1 GPU(s) held for big (expected start in 100 s) are closed to it: it has no duration hint")
    assert closed_by(p.held, 500.0, now=0.0, slack_s=30.0).endswith("ends more than 30 s after that")  # type: ignore[union-attr]
