"""A plug-in gives only its own rules; the engine composes them with what every policy shares."""

from __future__ import annotations

import pytest

from shared.mig.geometry import default_geometry
from shared.policy.placement.balancer import BalancerParams
from shared.policy.placement.decision import CannotPlace, Decision, JobRequest, Placement
from shared.policy.placement.rules import Rules, compose
from shared.policy.placement.sharing import share_instance
from shared.policy.request import Demand, mig
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of

pytestmark = pytest.mark.unit

GEO = default_geometry()
MODEL = "A100-80GB"


def _refuse(snap: ClusterSnapshot, job: JobRequest) -> Decision:
    return CannotPlace(job_id=job.job_id, policy="mine", reasons=("my rule says no",))


def _plain(gid: str, replicas: int = 0) -> GpuView:
    return GpuView.build(id=gid, node="n0", index=int(gid[1:]), model=MODEL, mig=False, replicas=replicas)


def _busy_mig(gid: str) -> GpuView:
    one = InstanceView(id=f"{gid}-m", profile="1g.10gb", start=6, size=1, compute=1, job_id=f"{gid}-job")
    return GpuView.build(id=gid, node="n0", index=int(gid[1:]), model=MODEL, instances=[one])


def test_a_policy_that_only_scores_mig_requests_places_shares_and_gangs_the_shared_way_under_its_name() -> None:
    policy = compose("mine", Rules(mig=_refuse))
    snap = snapshot_of(GEO, [_plain("g0", replicas=4), _plain("g1"), _plain("g2")])
    share = policy(snap, JobRequest(job_id="s", demand=Demand(kind="shared")))
    gang = policy(snap, JobRequest(job_id="w", demand=Demand(kind="gpus", gpus=2)))
    own = policy(snap, JobRequest(job_id="m", demand=mig("1g")))
    assert isinstance(share, Placement) and share.slots[0].gpu_id == "g0"
    assert isinstance(gang, Placement) and {s.gpu_id for s in gang.slots} == {"g1", "g2"}
    assert isinstance(own, CannotPlace) and own.reasons == ("my rule says no",)
    assert {d.policy for d in (share, gang, own)} == {"mine"}


def test_a_gang_goes_to_the_policys_gang_rule_once_plain_gpus_are_out_and_a_miss_gives_both_reasons() -> None:
    asked: list[str] = []

    def gang(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        asked.append(job.job_id)
        return _refuse(snap, job)

    policy = compose("mine", Rules(mig=_refuse, gang=gang))
    sharing = _plain("g1", replicas=2).with_instances(
        [share_instance(0, JobRequest(job_id="x", demand=Demand(kind="shared")), "i0", 0.0)])
    d = policy(snapshot_of(GEO, [_busy_mig("g0"), sharing]), JobRequest(job_id="w", demand=Demand(kind="gpus", gpus=1)))
    assert asked == ["w"]
    assert isinstance(d, CannotPlace) and "my rule says no" in d.reasons and len(d.reasons) > 1


def test_a_gang_that_misses_names_only_the_kinds_of_gpu_the_cluster_has() -> None:
    job = JobRequest(job_id="w", demand=Demand(kind="gpus", gpus=2))
    policy = compose("mine", Rules(mig=_refuse, gang=_refuse))
    only_mig = policy(snapshot_of(GEO, [_busy_mig("g0"), _busy_mig("g1")]), job)
    assert isinstance(only_mig, CannotPlace) and only_mig.reasons == ("my rule says no",)
    busy_share = JobRequest(job_id="x", demand=Demand(kind="shared"))
    only_plain = policy(snapshot_of(GEO, [_plain("g0", replicas=2).with_instances(
        [share_instance(0, busy_share, "i0", 0.0)]), _plain("g1")]), job)
    assert isinstance(only_plain, CannotPlace)
    assert only_plain.reasons == ("no node has 2 free plain (non-MIG) GPU(s); the most on one node is 1",)


def test_a_gang_kept_waiting_by_the_mig_rule_says_why_on_a_cluster_without_mig_gpus() -> None:
    def waits(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        return CannotPlace(job_id=job.job_id, policy="mine", reasons=("a long gang waits",), deferred=True)

    d = compose("mine", Rules(mig=_refuse, gang=waits))(snapshot_of(GEO, [_plain("g0")]),
                                                       JobRequest(job_id="w", demand=Demand(kind="gpus", gpus=2)))
    assert isinstance(d, CannotPlace) and d.deferred and "a long gang waits" in d.reasons and len(d.reasons) == 2


def test_a_static_layout_policy_that_lays_out_its_own_gangs_is_not_offered_plain_gpus_first() -> None:
    def gang(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        return CannotPlace(job_id=job.job_id, policy="mine", reasons=("only my layout",))

    policy = compose("mine", Rules(mig=_refuse, gang=gang, plain_first=False))
    d = policy(snapshot_of(GEO, [_plain("g0")]), JobRequest(job_id="w", demand=Demand(kind="gpus", gpus=1)))
    assert isinstance(d, CannotPlace) and d.reasons == ("only my layout",)


def test_rules_that_are_exactly_the_balancer_say_so_for_the_incremental_index() -> None:
    params = BalancerParams(threshold=0.5)
    assert compose("p", Rules(mig=_refuse, balancer_params=params)).balancer_params == params  # type: ignore[attr-defined]
    assert not hasattr(compose("p", Rules(mig=_refuse)), "balancer_params")
