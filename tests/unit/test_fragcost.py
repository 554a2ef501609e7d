"""FragCost bounds and the cluster fragmentation rate under a demand mix."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mig_strategies import GEO, MODELS, clusters

from shared.errors import RequestError
from shared.mig.occupancy import span
from shared.policy.fragcost import demand_weights, frag_cost, frag_cost_gpu, frag_rate, frag_slices_table
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of

pytestmark = pytest.mark.unit


@settings(max_examples=200, deadline=None)
@given(model=st.sampled_from([m.name for m in GEO.models]), mask=st.integers(0, 255))
def test_fragcost_is_between_zero_and_one_and_only_grows_as_slices_fill(model: str, mask: int) -> None:
    m = GEO.model(model)
    mask &= m.full_mask
    c = frag_cost(m, mask)
    assert 0.0 <= c <= 1.0
    for bit in range(m.memory_slices):
        assert frag_cost(m, mask | (1 << bit)) >= c - 1e-12


def test_fragcost_refuses_a_mask_beyond_the_gpu() -> None:
    with pytest.raises(ValueError, match="outside"):
        frag_cost(GEO.model("A30-24GB"), 0x10)


def _gpu(gid: str, model: str, *insts: tuple[str, int, bool]) -> GpuView:
    m = GEO.model(model)
    views = [InstanceView(id=f"{gid}/{p}@{s}", profile=p, start=s, size=m.profile(p).memory_slices,
                          compute=m.profile(p).compute_slices, job_id="j" if busy else None)
             for p, s, busy in insts]
    return GpuView.build(id=gid, node="n", index=0, model=model, instances=views)


def test_frag_cost_of_a_gpu_ignores_idle_instances() -> None:
    snap = snapshot_of(GEO, [_gpu("g", "A100-40GB", ("1g.5gb", 6, True), ("3g.20gb", 0, False))])
    assert frag_cost_gpu(snap, "g") == pytest.approx(0.315, abs=5e-4)


def test_an_empty_or_full_cluster_has_a_zero_fragmentation_rate() -> None:
    empty = snapshot_of(GEO, [_gpu("g", "A100-40GB")])
    assert frag_rate(empty, {"7g": 1.0, "3g": 1.0}) == 0.0
    # seven 1g instances at most: the eighth memory slice of an A100 is never usable by 1g alone
    assert frag_rate(empty, {"1g": 1.0}) == pytest.approx(1 / 8)
    full = snapshot_of(GEO, [_gpu("g", "A100-40GB", ("7g.40gb", 0, True))])
    assert frag_rate(full, {"3g": 1.0}) == 0.0


def test_free_slices_the_mix_cannot_use_count_as_fragmented() -> None:
    # 4g@0 + 2g@4 busy: slices 6 and 7 free; a 3g-only mix can use neither, a 1g-only mix uses slice 6
    snap = snapshot_of(GEO, [_gpu("g", "A100-40GB", ("4g.20gb", 0, True), ("2g.10gb", 4, True))])
    assert frag_rate(snap, {"3g": 1.0}) == pytest.approx(1.0)
    assert frag_rate(snap, {"1g": 1.0}) == pytest.approx(0.5)
    assert frag_rate(snap, {"1g": 1.0, "3g": 1.0}) == pytest.approx(0.75)
    assert frag_rate(snap, {"2g": 1.0}) == pytest.approx(1.0)  # 2g cannot start at 6
    assert frag_rate(snap, {"1g.2x": 1.0}) == pytest.approx(0.0)


def test_idle_instances_count_as_free_slices() -> None:
    busy_only = snapshot_of(GEO, [_gpu("g", "A100-40GB", ("4g.20gb", 0, True))])
    with_idle = snapshot_of(GEO, [_gpu("g", "A100-40GB", ("4g.20gb", 0, True), ("3g.20gb", 4, False))])
    assert frag_rate(busy_only, {"3g": 1.0}) == frag_rate(with_idle, {"3g": 1.0}) == 0.0


def test_one_mix_keyed_by_shape_applies_to_every_model_and_missing_shapes_cannot_use_anything() -> None:
    snap = snapshot_of(GEO, [_gpu("a", "A30-24GB"), _gpu("h", "H200-141GB", ("4g.71gb", 0, True))])
    # A30 has no 3g: its 4 free slices are unusable; the H200's 4 free slices take one 3g
    assert frag_rate(snap, {"3g": 1.0}) == pytest.approx(4 / 8)


@settings(max_examples=100, deadline=None)
@given(snap=clusters(max_gpus=20), shapes=st.lists(st.sampled_from(["1g", "2g", "3g", "4g", "7g", "1g.2x"]),
                                                    min_size=1, max_size=6))
def test_the_fragmentation_rate_is_a_share_and_matches_a_per_gpu_sum(
    snap: ClusterSnapshot, shapes: list[str]
) -> None:
    weights = demand_weights(shapes)
    rate = frag_rate(snap, weights)
    assert 0.0 <= rate <= 1.0
    unusable = free = 0.0
    for i, g in enumerate(snap.gpus):
        if not (snap.mig[i] and snap.healthy[i]):
            continue
        model = GEO.model(g.model)
        free += model.memory_slices - g.busy_mask.bit_count()
        unusable += float(frag_slices_table(model, weights)[g.busy_mask])
    assert rate == pytest.approx(unusable / free if free else 0.0)


def test_demand_weights_are_shares_by_shape() -> None:
    w = demand_weights(["1g", "3g.20gb", "nvidia.com/mig-1g.5gb", "3g", "1g.2x", "1g.5gb+me"])
    assert w == pytest.approx({"1g": 2 / 6, "3g": 2 / 6, "1g.2x": 1 / 6, "1g+me": 1 / 6})
    assert demand_weights([]) == {}
    with pytest.raises(RequestError):
        demand_weights(["huge"])


def test_weights_keyed_by_profile_name_count_as_their_shape_and_garbage_is_refused() -> None:
    snap = snapshot_of(GEO, [_gpu("g", "A100-40GB", ("4g.20gb", 0, True), ("2g.10gb", 4, True))])
    assert frag_rate(snap, {"3g.20gb": 1.0}) == frag_rate(snap, {"3g": 1.0})
    with pytest.raises(RequestError):
        frag_rate(snap, {"big": 1.0})
    with pytest.raises(RequestError):
        frag_rate(snap, {"1g": -1.0})


def test_the_pack_table_respects_max_counts_and_placements() -> None:
    for name in MODELS:
        m = GEO.model(name)
        table = frag_slices_table(m, {"1g": 1.0})
        assert table[0] == pytest.approx(1.0 if m.memory_slices == 8 else 0.0)
        assert table[m.full_mask] == 0.0
        assert table[span(1, 0)] >= 0.0
