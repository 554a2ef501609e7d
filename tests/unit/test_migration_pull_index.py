"""The incremental pull-source index gives the planner exactly the sources, order and moves of its columns."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mig_strategies import GEO, clusters, random_instances

from shared.policy.migration.planner import MigrationParams, _Plan, plan_after_exit, plan_defrag
from shared.policy.migration.pull_index import PullIndex
from shared.policy.snapshot import ClusterSnapshot, GpuView, snapshot_of

pytestmark = pytest.mark.unit

NOW = 1000.0
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PARAMS = st.builds(
    MigrationParams, threshold=st.sampled_from([0.2, 0.4, 0.6]), cooldown_s=st.sampled_from([0.0, 120.0]),
    max_moves=st.integers(1, 6), intra=st.booleans(), inter=st.booleans(),
    pull_into_empty=st.booleans(),
)


def _index(snap: ClusterSnapshot, threshold: float) -> PullIndex:
    index = PullIndex(threshold)
    index.sync(snap)
    return index


def _changed(snap: ClusterSnapshot, seed: int, share: float) -> tuple[ClusterSnapshot, list[int]]:
    """The same GPUs with a random share of them given new random layouts (the simulator's one-GPU changes)."""
    rng = random.Random(seed)
    gpus, changed = list(snap.gpus), []
    for p, g in enumerate(gpus):
        if rng.random() < share:
            model = GEO.model(g.model)
            insts = random_instances(rng, model, f"{g.id}x{seed}", rng.random(), rng.choice([0.0, 0.3]))
            gpus[p] = g.with_instances(insts)
            changed.append(p)
    return snapshot_of(GEO, gpus), changed


@SETTINGS
@given(snap=clusters(max_gpus=25), data=st.data())
def test_the_index_yields_the_sources_of_the_column_search_with_the_same_bounds_in_the_same_order(
    snap: ClusterSnapshot, data: st.DataObject
) -> None:
    params = MigrationParams(threshold=data.draw(st.sampled_from([0.2, 0.4, 0.6])))
    index = _index(snap, params.threshold)
    target = data.draw(st.sampled_from(snap.gpus))
    plan = _Plan(snap, NOW, params)
    t = plan.gpu(target.id)
    hostable = plan.hostable(t)
    assert list(index.heads(t.used, t.compute, hostable)) == list(plan._column_heads(t, hostable))


@SETTINGS
@given(snap=clusters(max_gpus=25), data=st.data())
def test_a_pull_with_the_index_plans_the_move_the_planner_plans_without_it(
    snap: ClusterSnapshot, data: st.DataObject
) -> None:
    params = MigrationParams(threshold=data.draw(st.sampled_from([0.2, 0.4, 0.6])),
                             cooldown_s=data.draw(st.sampled_from([0.0, 120.0])))
    index = _index(snap, params.threshold)
    for g in snap.gpus:
        assert plan_after_exit(snap, g.id, NOW, params, pulls=index) == plan_after_exit(snap, g.id, NOW, params)


@SETTINGS
@given(snap=clusters(max_gpus=25), params=PARAMS)
def test_a_defragmentation_with_the_index_plans_what_it_plans_without_it(
    snap: ClusterSnapshot, params: MigrationParams
) -> None:
    assert plan_defrag(snap, NOW, params, pulls=_index(snap, params.threshold)) == plan_defrag(snap, NOW, params)


@SETTINGS
@given(snap=clusters(max_gpus=25), seeds=st.lists(st.integers(0, 2**16), min_size=1, max_size=4),
       share=st.sampled_from([0.1, 0.3, 1.0]), threshold=st.sampled_from([0.2, 0.4]))
def test_an_index_synchronised_with_the_changed_gpus_only_equals_one_rebuilt_from_scratch(
    snap: ClusterSnapshot, seeds: list[int], share: float, threshold: float
) -> None:
    index = _index(snap, threshold)
    params = MigrationParams(threshold=threshold, cooldown_s=0.0)
    for seed in seeds:
        snap, changed = _changed(snap, seed, share)
        index.sync(snap, changed)
        assert index.sources() == _index(snap, threshold).sources()
        assert plan_defrag(snap, NOW, params, pulls=index) == plan_defrag(snap, NOW, params)


def test_an_index_of_another_snapshot_or_threshold_is_not_used() -> None:
    busy = GpuView.build(id="b", node="n", index=0, model="A100-40GB",
                         instances=random_instances(random.Random(3), GEO.model("A100-40GB"), "b", 1.0, 0.0))
    lazy = GpuView.build(id="l", node="n", index=1, model="A100-40GB")
    snap = snapshot_of(GEO, [busy, lazy])
    stale = _index(snapshot_of(GEO, [lazy, lazy.with_instances(())]), 0.4)
    other = _index(snap, 0.9)
    params = MigrationParams(cooldown_s=0.0)
    expected = plan_after_exit(snap, "l", NOW, params)
    assert expected and not stale.sources() and not other.sources()
    assert plan_after_exit(snap, "l", NOW, params, pulls=stale) == expected
    assert plan_after_exit(snap, "l", NOW, params, pulls=other) == expected


def test_a_gpu_that_stops_being_a_source_leaves_the_index() -> None:
    model = GEO.model("A100-40GB")
    busy = GpuView.build(id="b", node="n", index=0, model=model.name,
                         instances=random_instances(random.Random(3), model, "b", 1.0, 0.0))
    snap = snapshot_of(GEO, [busy])
    index = _index(snap, 0.0)
    assert list(index.sources()) == [0]
    emptied = snapshot_of(GEO, [busy.with_instances(())])
    index.sync(emptied, [0])
    assert index.sources() == {}
    assert list(index.heads(0, model.compute_slices, (frozenset(p.name for p in model.profiles),))) == []
