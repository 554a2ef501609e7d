"""Reserved capacity: k GPUs able to host a full-size instance stay free for bursts of large jobs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.mig.geometry import default_geometry
from shared.policy.placement.balancer import place
from shared.policy.placement.decision import CannotPlace, JobRequest, Placement
from shared.policy.placement.sharing import share_instance
from shared.policy.request import Demand, mig
from shared.policy.reserve import ReserveParams, free_full, hold_back, place_reserving, respects_reserve
from shared.policy.snapshot import GpuView, InstanceView, snapshot_of

pytestmark = pytest.mark.unit

GEO = default_geometry()
MODEL = "A100-40GB"


def _busy(gid: str, index: int, profile: str = "3g.20gb", start: int = 4, size: int = 4,
          compute: int = 3) -> GpuView:
    inst = InstanceView(id=f"{gid}-i", profile=profile, start=start, size=size, compute=compute,
                        job_id=f"{gid}-j")
    return GpuView.build(id=gid, node="n", index=index, model=MODEL, instances=[inst])


def _free(gid: str, index: int, idle: bool = False) -> GpuView:
    insts = [InstanceView(id=f"{gid}-idle", profile="1g.5gb", start=0, size=1, compute=1)] if idle else []
    return GpuView.build(id=gid, node="n", index=index, model=MODEL, instances=insts)


def _job(demand: Demand) -> JobRequest:
    return JobRequest(job_id="new", demand=demand)


K1 = ReserveParams(reserve_full=1)


def test_free_full_counts_gpus_without_busy_instances_and_plain_gpus_without_any_job() -> None:
    share = share_instance(0, _job(Demand(kind="shared")), "s", 0.0)
    snap = snapshot_of(GEO, [
        _free("a", 0), _free("b", 1, idle=True), _busy("c", 2),
        GpuView.build(id="p", node="n", index=3, model=MODEL, mig=False, replicas=2),
        GpuView.build(id="q", node="n", index=4, model=MODEL, mig=False, replicas=2, instances=[share]),
        GpuView.build(id="u", node="n", index=5, model=MODEL, healthy=False),
    ])
    assert free_full(snap).tolist() == [True, True, False, True, False, False]


def test_a_small_job_goes_to_a_busy_gpu_when_it_fits_there() -> None:
    snap = snapshot_of(GEO, [_free("free", 0), _busy("busy", 1)])
    d = place_reserving(snap, _job(mig("1g.5gb")), K1)
    assert isinstance(d, Placement) and d.slot.gpu_id == "busy"


def test_a_small_job_that_would_take_the_last_free_gpu_waits_with_reason_reserved_capacity() -> None:
    snap = snapshot_of(GEO, [_free("free", 0), _busy("busy", 1, "7g.40gb", 0, 8, 7)])
    assert isinstance(place(snap, _job(mig("1g.5gb"))), Placement)  # without the reserve it would go there
    d = place_reserving(snap, _job(mig("1g.5gb")), K1)
    assert isinstance(d, CannotPlace)
    assert d.reasons[0].startswith("reserved capacity")
    assert d.counts["reserved capacity"] == 1


def test_a_full_size_request_may_use_the_reserve() -> None:
    snap = snapshot_of(GEO, [_free("free", 0), _busy("busy", 1)])
    d = place_reserving(snap, _job(mig("7g.40gb")), K1)
    assert isinstance(d, Placement) and d.slot.gpu_id == "free"
    g = place_reserving(snap, _job(Demand(kind="gpus", gpus=1)), K1)
    assert isinstance(g, Placement) and g.slot.gpu_id == "free"


def test_with_more_free_gpus_than_the_reserve_small_jobs_may_take_one() -> None:
    snap = snapshot_of(GEO, [_free("a", 0), _free("b", 1)])
    d = place_reserving(snap, _job(mig("1g.5gb")), K1)
    assert isinstance(d, Placement)
    assert respects_reserve(snap, _job(mig("1g.5gb")), d, 1)
    assert not respects_reserve(snap, _job(mig("1g.5gb")), d, 2)


def test_a_reserve_of_zero_changes_nothing() -> None:
    snap = snapshot_of(GEO, [_free("free", 0)])
    assert isinstance(place_reserving(snap, _job(mig("1g.5gb")), ReserveParams(reserve_full=0)), Placement)
    assert hold_back(snap, 0) == (snap, 0)


def test_the_reserve_also_keeps_free_plain_gpus_from_time_sliced_shares() -> None:
    plain = GpuView.build(id="p", node="n", index=0, model=MODEL, mig=False, replicas=4)
    snap = snapshot_of(GEO, [plain])
    d = place_reserving(snap, _job(Demand(kind="shared")), K1)
    assert isinstance(d, CannotPlace) and d.reasons[0].startswith("reserved capacity")


def test_held_back_snapshots_share_the_gpus_and_hide_only_the_reserved_ones() -> None:
    snap = snapshot_of(GEO, [_free("a", 0), _busy("b", 1)])
    held, hidden = hold_back(snap, 1)
    assert hidden == 1 and held.gpus is snap.gpus
    assert held.healthy.tolist() == [False, True] and snap.healthy.tolist() == [True, True]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["free", "idle", "3g", "7g", "1g"]), min_size=1, max_size=6),
       st.sampled_from(["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]), st.integers(0, 3))
def test_a_small_placement_never_takes_the_last_k_free_full_gpus(
    kinds: list[str], profile: str, k: int
) -> None:
    gpus = []
    for i, kind in enumerate(kinds):
        if kind in ("free", "idle"):
            gpus.append(_free(f"g{i}", i, idle=kind == "idle"))
        elif kind == "7g":
            gpus.append(_busy(f"g{i}", i, "7g.40gb", 0, 8, 7))
        elif kind == "1g":
            gpus.append(_busy(f"g{i}", i, "1g.5gb", 6, 1, 1))
        else:
            gpus.append(_busy(f"g{i}", i))
    snap = snapshot_of(GEO, gpus)
    job = _job(mig(profile))
    d = place_reserving(snap, job, ReserveParams(reserve_full=k))
    plain = place(snap, job)
    if isinstance(d, Placement):
        assert respects_reserve(snap, job, d, k)
    else:
        # refused only when unplaceable anyway or because of the reserve
        assert isinstance(plain, CannotPlace) or d.reasons[0].startswith("reserved capacity")
