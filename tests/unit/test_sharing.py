"""Non-MIG GPUs: whole-GPU gangs and time-sliced shares, per-GPU sharing mode, mixed clusters."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.mig.geometry import default_geometry
from shared.policy.placement.balancer import place
from shared.policy.placement.decision import CannotPlace, JobRequest, Placement
from shared.policy.placement.sharing import (
    SHARE_PROFILE,
    WHOLE_PROFILE,
    free_replica,
    is_free_plain,
    place_plain_gpus,
    place_share,
    share_instance,
    shares_used,
    whole_instance,
)
from shared.policy.request import Demand, mig
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of

pytestmark = pytest.mark.unit

GEO = default_geometry()
MODEL = "A100-80GB"


def _job(demand: Demand, job_id: str = "j") -> JobRequest:
    return JobRequest(job_id=job_id, demand=demand)


def _plain(gid: str, node: str = "n0", index: int = 0, replicas: int = 0,
           shares: int = 0, whole: bool = False) -> GpuView:
    insts: list[InstanceView] = [
        share_instance(r, _job(Demand(kind="shared"), f"{gid}-s{r}"), f"{gid}-i{r}", 0.0)
        for r in range(shares)
    ]
    if whole:
        insts.append(whole_instance(GEO.model(MODEL), _job(Demand(kind="gpus"), f"{gid}-w"), f"{gid}-w", 0.0))
    return GpuView.build(id=gid, node=node, index=index, model=MODEL, mig=False, replicas=replicas,
                         instances=insts)


def _mig(gid: str, node: str = "n0", index: int = 0, busy: bool = False) -> GpuView:
    one = InstanceView(id=f"{gid}-m", profile="1g.10gb", start=6, size=1, compute=1, job_id=f"{gid}-job")
    insts = [one] if busy else []
    return GpuView.build(id=gid, node=node, index=index, model=MODEL, instances=insts)


def _snap(*gpus: GpuView) -> ClusterSnapshot:
    return snapshot_of(GEO, gpus)


def test_a_whole_gpu_job_on_a_plain_gpu_is_recorded_as_one_instance_filling_the_gpu() -> None:
    g = _plain("g", whole=True)
    assert g.instances[0].profile == WHOLE_PROFILE
    assert g.busy_mask == 0xFF and g.used_compute == 7
    assert not is_free_plain(g)


def test_a_used_share_is_an_instance_of_size_zero_at_its_replica_index() -> None:
    g = _plain("g", replicas=3, shares=2)
    assert [i.start for i in g.instances] == [0, 1]
    assert all(i.profile == SHARE_PROFILE and i.size == 0 for i in g.instances)
    assert g.busy_mask == 0 and shares_used(g) == 2 and free_replica(g) == 2


def test_a_whole_gpu_gang_takes_n_free_plain_gpus_on_the_tightest_node() -> None:
    snap = _snap(_plain("a0", "a", 0), _plain("a1", "a", 1), _plain("a2", "a", 2),
                 _plain("b0", "b", 0), _plain("b1", "b", 1), _plain("b2", "b", 2, whole=True))
    d = place(snap, _job(Demand(kind="gpus", gpus=2)))
    assert isinstance(d, Placement)
    assert [s.gpu_id for s in d.slots] == ["b0", "b1"]
    assert all(s.profile == WHOLE_PROFILE and s.size == 8 for s in d.slots)


def test_a_gang_that_fits_on_a_node_never_spans_two() -> None:
    snap = _snap(_plain("a0", "a", 0), _plain("a1", "a", 1, whole=True), _plain("b0", "b", 0))
    d = place(snap, _job(Demand(kind="gpus", gpus=2)))
    assert isinstance(d, CannotPlace)  # node a holds two GPUs: the gang waits for them, not for two nodes
    assert "no node has 2 free plain" in d.reasons[0]


def test_a_gang_bigger_than_every_node_spans_the_fewest_nodes() -> None:
    snap = _snap(_plain("a0", "a", 0), _plain("b0", "b", 0))
    d = place(snap, _job(Demand(kind="gpus", gpus=2)))
    assert isinstance(d, Placement) and {s.node for s in d.slots} == {"a", "b"}


def test_a_gang_prefers_dedicated_gpus_over_time_sliced_ones() -> None:
    snap = _snap(_plain("t", "a", 0, replicas=4), _plain("d", "a", 1))
    d = place_plain_gpus(snap, _job(Demand(kind="gpus", gpus=1)))
    assert isinstance(d, Placement) and d.slot.gpu_id == "d"


def test_a_time_sliced_gpu_in_use_by_shares_takes_no_whole_gpu_job() -> None:
    snap = _snap(_plain("t", "a", 0, replicas=4, shares=1))
    assert isinstance(place(snap, _job(Demand(kind="gpus", gpus=1))), CannotPlace)


def test_time_sliced_gpus_can_be_kept_for_shares_only() -> None:
    snap = _snap(_plain("t", "a", 0, replicas=4))
    d = place_plain_gpus(snap, _job(Demand(kind="gpus", gpus=1)), whole_on_shared=False)
    assert isinstance(d, CannotPlace)


def test_a_gang_falls_back_to_free_mig_gpus_and_never_mixes_kinds() -> None:
    snap = _snap(_plain("p", "a", 0), _mig("m0", "a", 1), _mig("m1", "a", 2))
    d = place(snap, _job(Demand(kind="gpus", gpus=2)))
    assert isinstance(d, Placement)
    assert {s.gpu_id for s in d.slots} == {"m0", "m1"}
    assert all(s.profile == "7g.80gb" for s in d.slots)


def test_shares_pack_onto_the_gpu_with_the_most_shares_used_that_has_a_free_replica() -> None:
    snap = _snap(_plain("empty", "a", 0, replicas=4), _plain("two", "a", 1, replicas=4, shares=2),
                 _plain("full", "a", 2, replicas=2, shares=2))
    d = place(snap, _job(Demand(kind="shared")))
    assert isinstance(d, Placement)
    assert (d.slot.gpu_id, d.slot.start, d.slot.profile) == ("two", 2, SHARE_PROFILE)
    assert any("packs shares" in r for r in d.reasons)
    assert any("no memory isolation" in r for r in d.reasons)


def test_share_ties_go_to_the_lower_gpu_index() -> None:
    snap = _snap(_plain("hi", "a", 3, replicas=2), _plain("lo", "b", 1, replicas=2))
    d = place_share(snap, _job(Demand(kind="shared")))
    assert isinstance(d, Placement) and d.slot.gpu_id == "lo"


def test_a_share_never_lands_on_a_mig_gpu_or_a_gpu_without_replicas() -> None:
    snap = _snap(_mig("m"), _plain("p", replicas=0), _plain("w", index=1, replicas=2, whole=True))
    d = place(snap, _job(Demand(kind="shared")))
    assert isinstance(d, CannotPlace)
    assert d.reasons[0] == "no time-sliced GPU has a free replica"
    assert d.counts["MIG GPU (shares need a non-MIG GPU)"] == 1


def test_a_mig_request_never_lands_on_a_plain_gpu() -> None:
    snap = _snap(_plain("p"), _plain("t", index=1, replicas=4))
    d = place(snap, _job(mig("1g.10gb")))
    assert isinstance(d, CannotPlace)


def test_unhealthy_plain_gpus_take_nothing() -> None:
    sick = GpuView.build(id="s", node="n", index=0, model=MODEL, mig=False, replicas=2, healthy=False)
    snap = _snap(sick)
    assert isinstance(place(snap, _job(Demand(kind="shared"))), CannotPlace)
    assert isinstance(place(snap, _job(Demand(kind="gpus"))), CannotPlace)


_gpu_specs = st.lists(
    st.tuples(st.booleans(), st.integers(0, 4), st.integers(0, 4), st.booleans(), st.integers(0, 2)),
    min_size=1, max_size=8,
)


def _mixed(specs: list[tuple[bool, int, int, bool, int]]) -> ClusterSnapshot:
    gpus = []
    for k, (is_mig, replicas, shares, whole, node) in enumerate(specs):
        if is_mig:
            gpus.append(_mig(f"g{k}", f"n{node}", k, busy=whole))
        else:
            used = 0 if whole else min(shares, replicas)
            gpus.append(_plain(f"g{k}", f"n{node}", k, replicas=replicas, shares=used, whole=whole))
    return _snap(*gpus)


@settings(max_examples=120, deadline=None)
@given(_gpu_specs, st.sampled_from(["shared", "gpus1", "gpus2", "mig"]))
def test_in_mixed_clusters_every_placement_respects_each_gpus_sharing_mode(
    specs: list[tuple[bool, int, int, bool, int]], kind: str
) -> None:
    snap = _mixed(specs)
    demand = {"shared": Demand(kind="shared"), "gpus1": Demand(kind="gpus", gpus=1),
              "gpus2": Demand(kind="gpus", gpus=2), "mig": mig("2g.20gb")}[kind]
    d = place(snap, _job(demand, "new"))
    if not isinstance(d, Placement):
        return
    gpus = [snap.gpu(s.gpu_id) for s in d.slots]
    if kind == "mig":
        assert all(g.mig for g in gpus)
    elif kind == "shared":
        g = gpus[0]
        assert not g.mig and g.replicas >= 1 and shares_used(g) < g.replicas
        assert d.slot.start == free_replica(g)
    else:
        # a node's room for a gang: its GPUs of one kind (a gang never mixes MIG and plain GPUs)
        largest = max(sum(1 for g in snap.gpus if g.node == n and g.mig == mig)
                      for n in {g.node for g in snap.gpus} for mig in (False, True))
        assert len(gpus) == demand.gpus
        assert len({g.node for g in gpus}) == (1 if demand.gpus <= largest else -(-demand.gpus // largest))
        assert len({g.mig for g in gpus}) == 1
        for g in gpus:
            assert (g.busy_mask == 0) if g.mig else is_free_plain(g)
