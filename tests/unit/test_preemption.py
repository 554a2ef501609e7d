"""Victim selection: strictly lower priority (or reclaimable borrowers), never protected, cheapest first."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.mig.geometry import default_geometry
from shared.mig.occupancy import enumerate_layouts, span
from shared.policy.placement.decision import JobRequest
from shared.policy.placement.sharing import share_instance, whole_instance
from shared.policy.preemption import NoVictims, Victims, choose_victims
from shared.policy.priority import PriorityClass
from shared.policy.quota import CohortPolicy, QuotaBook, QuotaPolicy, TenantQuota, charge
from shared.policy.request import Demand, mig
from shared.policy.resources import COMPUTE
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of

pytestmark = pytest.mark.unit

GEO = default_geometry()
MODEL = "A100-40GB"
M = GEO.model(MODEL)


def _inst(job: str, profile: str, start: int, prio: int = 0, tenant: str = "t", started: float = 0.0,
          preemptible: bool = True) -> InstanceView:
    p = M.profile(profile)
    return InstanceView(id=f"i-{job}", profile=profile, start=start, size=p.memory_slices,
                        compute=p.compute_slices, job_id=job, priority=prio, tenant=tenant,
                        started_at=started,
                        preemptible=preemptible)


def _gpu(gid: str, *insts: InstanceView, node: str = "n0", index: int = 0) -> GpuView:
    return GpuView.build(id=gid, node=node, index=index, model=MODEL, instances=insts)


def _snap(*gpus: GpuView) -> ClusterSnapshot:
    return snapshot_of(GEO, gpus)


def _job(demand: Demand, prio: int, tenant: str = "t") -> JobRequest:
    return JobRequest(job_id="new", demand=demand, priority=prio, tenant=tenant)


def _seven_ones(gid: str, prio: int, index: int = 0) -> GpuView:
    return _gpu(gid, *(_inst(f"{gid}-{s}", "1g.5gb", s, prio) for s in range(7)), index=index)


def test_a_high_priority_training_job_preempts_the_fewest_low_priority_inference_jobs() -> None:
    two = _gpu("b", _inst("b3", "3g.20gb", 4, 1), _inst("b4", "4g.20gb", 0, 1), index=1)
    snap = _snap(_seven_ones("a", 1), two)
    v = choose_victims(snap, _job(mig("7g.40gb"), 100), now=10.0)
    assert isinstance(v, Victims)
    assert sorted(x.job_id for x in v.victims) == ["b3", "b4"]
    assert v.placement.slot.gpu_id == "b" and v.placement.slot.profile == "7g.40gb"
    assert set(v.placement.slot.destroy) == {"i-b3", "i-b4"}
    assert all(x.why == "priority" for x in v.victims)


def test_equal_or_higher_priority_jobs_are_never_victims() -> None:
    snap = _snap(_gpu("a", _inst("eq", "4g.20gb", 0, 5), _inst("hi", "3g.20gb", 4, 9)))
    v = choose_victims(snap, _job(mig("3g.20gb"), 5), now=0.0)
    assert isinstance(v, NoVictims)
    assert any("equal/higher-priority" in r for r in v.reasons)


def test_a_non_preemptible_job_is_never_a_victim() -> None:
    snap = _snap(_gpu("a", _inst("p", "4g.20gb", 0, 0, preemptible=False), _inst("q", "3g.20gb", 4, 0)))
    v = choose_victims(snap, _job(mig("4g.20gb"), 10), now=0.0)
    assert isinstance(v, NoVictims)
    w = choose_victims(snap, _job(mig("3g.20gb"), 10), now=0.0)
    assert isinstance(w, Victims) and [x.job_id for x in w.victims] == ["q"]


def test_a_class_that_never_preempts_gets_no_victims() -> None:
    snap = _snap(_seven_ones("a", 0))
    never = PriorityClass(name="batch", value=100, preemption="Never")
    v = choose_victims(snap, _job(mig("1g.5gb"), 100), now=0.0, klass=never)
    assert isinstance(v, NoVictims) and "never preempts" in v.reasons[0]


def test_among_equally_many_victims_the_least_lost_work_wins() -> None:
    snap = _snap(_gpu("a", _inst("old", "3g.20gb", 0, 0, started=0.0),
                      _inst("new3", "3g.20gb", 4, 0, started=90.0)))
    v = choose_victims(snap, _job(mig("3g.20gb"), 1), now=100.0)
    assert isinstance(v, Victims) and [x.job_id for x in v.victims] == ["new3"]
    assert v.lost_work_s == 10.0


def test_a_recent_checkpoint_lowers_the_lost_work_of_a_victim() -> None:
    snap = _snap(_gpu("a", _inst("old", "3g.20gb", 0, 0, started=0.0),
                      _inst("new3", "3g.20gb", 4, 0, started=90.0)))
    v = choose_victims(snap, _job(mig("3g.20gb"), 1), now=100.0, checkpoints={"old": 98.0})
    assert isinstance(v, Victims) and [x.job_id for x in v.victims] == ["old"]


def test_with_equal_cost_the_lowest_priority_victim_is_chosen() -> None:
    snap = _snap(_gpu("a", _inst("p3", "3g.20gb", 0, 3), _inst("p1", "3g.20gb", 4, 1)))
    v = choose_victims(snap, _job(mig("3g.20gb"), 5), now=0.0)
    assert isinstance(v, Victims) and [x.job_id for x in v.victims] == ["p1"]


def test_a_victims_instance_of_the_exact_profile_and_start_is_reused() -> None:
    snap = _snap(_gpu("a", _inst("p1", "3g.20gb", 4, 1), _inst("keep", "4g.20gb", 0, 9)))
    v = choose_victims(snap, _job(mig("3g.20gb"), 5), now=0.0)
    assert isinstance(v, Victims)
    assert v.placement.slot.action == "reuse" and v.placement.slot.instance_id == "i-p1"


def test_a_time_sliced_share_preempts_one_lower_priority_share() -> None:
    model = GEO.model(MODEL)
    shares = [share_instance(r, JobRequest(job_id=f"s{r}", demand=Demand(kind="shared"), priority=r),
                             f"si{r}",
                             float(r)) for r in range(2)]
    g = GpuView.build(id="t", node="n", index=0, model=MODEL, mig=False, replicas=2, instances=shares)
    w = GpuView.build(id="w", node="n", index=1, model=MODEL, mig=False, replicas=2, instances=[
        whole_instance(model, JobRequest(job_id="big", demand=Demand(kind="gpus"), priority=0), "wi", 0.0)])
    v = choose_victims(_snap(g, w), _job(Demand(kind="shared"), 1), now=10.0)
    assert isinstance(v, Victims) and [x.job_id for x in v.victims] == ["s0"]
    assert v.placement.slot.profile == "shared" and v.placement.slot.start == 0


def test_a_gang_frees_n_gpus_on_one_node_and_stops_a_gang_victim_on_all_its_gpus() -> None:
    model = GEO.model(MODEL)
    gang = JobRequest(job_id="gang", demand=Demand(kind="gpus", gpus=2), priority=0)
    a = GpuView.build(id="a", node="n", index=0, model=MODEL, mig=False,
                      instances=[whole_instance(model, gang, "wa", 0)])
    b = GpuView.build(id="b", node="n", index=1, model=MODEL, mig=False,
                      instances=[whole_instance(model, gang, "wb", 0)])
    c = GpuView.build(id="c", node="m", index=0, model=MODEL, mig=False,
                      instances=[whole_instance(model, JobRequest(job_id="vip", demand=Demand(kind="gpus"),
                                                                  priority=50), "wc", 0)])
    v = choose_victims(_snap(a, b, c), _job(Demand(kind="gpus", gpus=2), 10), now=5.0)
    assert isinstance(v, Victims)
    assert [x.job_id for x in v.victims] == ["gang"]
    assert v.victims[0].instance_ids == ("wa", "wb") and v.victims[0].gpu_ids == ("a", "b")
    assert {s.gpu_id for s in v.placement.slots} == {"a", "b"}


def test_a_gang_bigger_than_a_node_frees_the_cheapest_gpus_across_nodes_and_stops_a_spanning_victim() -> None:
    # three nodes of two MIG GPUs: a low-priority gang spans n0 and n1, n2 holds one low and one protected job
    full = "7g.40gb"
    old = [_gpu(f"{n}{i}", InstanceView(id=f"w{n}{i}", profile=full, start=0, size=8, compute=7, job_id="old",
                                        priority=0), node=n, index=i)
           for n in ("n0", "n1") for i in range(2)]
    low = _gpu("n20", _inst("low", "3g.20gb", 4, 0), node="n2", index=0)
    vip = _gpu("n21", _inst("vip", "3g.20gb", 4, 90), node="n2", index=1)
    v = choose_victims(_snap(*old, low, vip), _job(Demand(kind="gpus", gpus=4), 10), now=5.0)
    assert isinstance(v, Victims)
    assert [x.job_id for x in v.victims] == ["old"]  # one victim frees four GPUs on two nodes
    assert v.victims[0].gpu_ids == ("n00", "n01", "n10", "n11")
    assert [s.gpu_id for s in v.placement.slots] == ["n00", "n01", "n10", "n11"]
    five = choose_victims(_snap(*old, low, vip), _job(Demand(kind="gpus", gpus=5), 10), now=5.0)
    assert isinstance(five, Victims) and {x.job_id for x in five.victims} == {"old", "low"}
    assert isinstance(choose_victims(_snap(*old, low, vip), _job(Demand(kind="gpus", gpus=6), 10), now=5.0),
                      NoVictims)


def _cohort_book(borrower_usage: float) -> QuotaBook:
    policy = QuotaPolicy([TenantQuota(name="lender", cohort="x", quota={COMPUTE: 7}),
                          TenantQuota(name="borrower", cohort="x", quota={COMPUTE: 0})],
                         [CohortPolicy(name="x")])
    return charge(QuotaBook(policy), "borrower", {COMPUTE: borrower_usage})


def test_a_lender_reclaims_lent_quota_by_preempting_borrowers_whatever_their_priority() -> None:
    snap = _snap(_gpu("a", _inst("b1", "4g.20gb", 0, 99, tenant="borrower"),
                      _inst("b2", "3g.20gb", 4, 99, tenant="borrower")))
    job = _job(mig("3g.20gb"), 0, tenant="lender")
    assert isinstance(choose_victims(snap, job, now=0.0), NoVictims)
    v = choose_victims(snap, job, now=0.0, book=_cohort_book(7))
    assert isinstance(v, Victims) and v.victims[0].why == "reclaim"
    assert "borrower borrows compute_slices from cohort x" in v.victims[0].detail


def test_reclaim_needs_the_request_to_fit_the_lenders_own_quota() -> None:
    snap = _snap(_gpu("a", _inst("b1", "7g.40gb", 0, 99, tenant="borrower")))
    policy = QuotaPolicy([TenantQuota(name="lender", cohort="x", quota={COMPUTE: 2}),
                          TenantQuota(name="borrower", cohort="x", quota={COMPUTE: 5})],
                         [CohortPolicy(name="x")])
    book = charge(QuotaBook(policy), "borrower", {COMPUTE: 7})
    assert isinstance(choose_victims(snap, _job(mig("3g.20gb"), 0, "lender"), now=0.0, book=book), NoVictims)
    assert isinstance(choose_victims(snap, _job(mig("2g.10gb"), 0, "lender"), now=0.0, book=book), Victims)


def test_a_cohort_can_limit_reclaim_to_lower_priority_borrowers_or_forbid_it() -> None:
    snap = _snap(_gpu("a", _inst("b1", "7g.40gb", 0, 5, tenant="borrower")))
    for rule, prio, expected in (("LowerPriority", 5, NoVictims), ("LowerPriority", 6, Victims),
                                 ("Never", 0, NoVictims)):
        policy = QuotaPolicy([TenantQuota(name="lender", cohort="x", quota={COMPUTE: 7}),
                              TenantQuota(name="borrower", cohort="x", quota={COMPUTE: 0})],
                             [CohortPolicy(name="x", reclaim=rule)])  # type: ignore[arg-type]
        book = charge(QuotaBook(policy), "borrower", {COMPUTE: 7})
        never = PriorityClass(name="n", value=prio, preemption="Never")
        got = choose_victims(snap, _job(mig("1g.5gb"), prio, "lender"), now=0.0, book=book, klass=never)
        assert isinstance(got, expected), (rule, prio)


def test_a_tenant_within_its_quota_is_not_a_reclaim_victim() -> None:
    snap = _snap(_gpu("a", _inst("b1", "7g.40gb", 0, 99, tenant="borrower")))
    book = _cohort_book(0)
    assert isinstance(choose_victims(snap, _job(mig("1g.5gb"), 0, "lender"), now=0.0, book=book), NoVictims)


# ---- properties over random clusters -------------------------------------------------------------------

PROFILES = [p for p in M.profiles if not p.media_extensions]
LAYOUTS = list(enumerate_layouts(M, PROFILES))


@st.composite
def _cluster(draw: st.DrawFn) -> ClusterSnapshot:
    gpus = []
    for g in range(draw(st.integers(1, 3))):
        insts = []
        for k, (name, start) in enumerate(draw(st.sampled_from(LAYOUTS))):
            busy = draw(st.integers(0, 4)) > 0
            p = M.profile(name)
            insts.append(InstanceView(
                id=f"g{g}i{k}", profile=name, start=start, size=p.memory_slices, compute=p.compute_slices,
                job_id=f"g{g}j{k}" if busy else None, priority=draw(st.integers(0, 3)),
                preemptible=draw(st.integers(0, 5)) > 0, started_at=float(draw(st.integers(0, 100))),
            ))
        gpus.append(GpuView.build(id=f"g{g}", node="n", index=g, model=MODEL, instances=insts))
    return _snap(*gpus)


def _min_victims(snap: ClusterSnapshot, profile: str, prio: int) -> int | None:
    """Independent oracle: fewest eligible busy instances overlapping a legal start, over all GPUs."""
    p = M.profile(profile)
    best: int | None = None
    for g in snap.gpus:
        for s in p.placements:
            pm = span(p.memory_slices, s)
            hit = [i for i in g.instances if i.busy and i.mask & pm]
            if any(i.priority >= prio or not i.preemptible for i in hit) or not hit:
                continue
            if sum(1 for i in g.instances if i.profile == profile and not i.mask & pm) >= p.max_count:
                continue
            best = len(hit) if best is None else min(best, len(hit))
    return best


@settings(max_examples=200, deadline=None)
@given(_cluster(), st.sampled_from([p.name for p in PROFILES]), st.integers(0, 4))
def test_victims_are_strictly_lower_priority_preemptible_fewest_and_leave_a_legal_placement(
    snap: ClusterSnapshot, profile: str, prio: int
) -> None:
    v = choose_victims(snap, _job(mig(profile), prio), now=200.0)
    expected = _min_victims(snap, profile, prio)
    if isinstance(v, NoVictims):
        assert expected is None
        return
    assert expected is not None and len(v.victims) == expected
    gone = {x.job_id for x in v.victims}
    slot = v.placement.slot
    gpu = snap.gpu(slot.gpu_id)
    for inst in gpu.instances:
        if inst.job_id in gone:
            assert inst.priority < prio and inst.preemptible
    remaining = [i for i in gpu.instances if i.busy and i.job_id not in gone]
    mask = 0
    for i in remaining:
        mask |= i.mask
    p = M.profile(slot.profile)
    assert slot.start in p.placements
    assert not mask & span(p.memory_slices, slot.start)
    kept_same = [i for i in gpu.instances if i.profile == p.name and i.id not in slot.destroy
                 and i.id != slot.instance_id and not (i.mask & span(p.memory_slices, slot.start))]
    assert len(kept_same) < p.max_count
    assert all(x.lost_work_s >= 0 for x in v.victims)


@st.composite
def _tenanted(draw: st.DrawFn) -> tuple[ClusterSnapshot, QuotaBook]:
    tenants = ("lender", "b1", "b2", "outsider")
    gpus = []
    for g in range(draw(st.integers(1, 2))):
        insts = []
        for k, (name, start) in enumerate(draw(st.sampled_from(LAYOUTS))):
            p = M.profile(name)
            insts.append(InstanceView(
                id=f"g{g}i{k}", profile=name, start=start, size=p.memory_slices, compute=p.compute_slices,
                job_id=f"g{g}j{k}", priority=draw(st.integers(0, 3)), tenant=draw(st.sampled_from(tenants)),
                preemptible=draw(st.integers(0, 5)) > 0,
            ))
        gpus.append(GpuView.build(id=f"g{g}", node="n", index=g, model=MODEL, instances=insts))
    snap = _snap(*gpus)
    policy = QuotaPolicy([TenantQuota(name=t, cohort=None if t == "outsider" else "x",
                                      quota={COMPUTE: float(draw(st.integers(0, 7)))}) for t in tenants],
                         [CohortPolicy(name="x")])
    book = QuotaBook(policy)
    for g in gpus:
        for i in g.instances:
            book = charge(book, i.tenant, {COMPUTE: i.compute})
    return snap, book


@settings(max_examples=150, deadline=None)
@given(_tenanted(), st.sampled_from([p.name for p in PROFILES]), st.integers(0, 4))
def test_reclaim_victims_are_borrowers_of_the_lenders_cohort_and_never_protected(
    world: tuple[ClusterSnapshot, QuotaBook], profile: str, prio: int
) -> None:
    snap, book = world
    never = PriorityClass(name="n", value=prio, preemption="Never")
    v = choose_victims(snap, _job(mig(profile), prio, "lender"), now=0.0, book=book, klass=never)
    if isinstance(v, NoVictims):
        return
    for x in v.victims:
        assert x.why == "reclaim" and x.tenant in ("b1", "b2")
        assert COMPUTE in book.borrowed(x.tenant)
        inst = snap.find_job(x.job_id)
        assert inst is not None and inst[1].preemptible
