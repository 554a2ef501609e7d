"""The exit screen says "no moves" only when the planner plans none, and the pull index's cooldown mode changes
which sources a pull visits, never the pull."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mig_strategies import GEO, MIGRATION_PARAMS, clusters, random_instances
from mig_strategies import keyed_pull_index as _keyed

from shared.policy.migration.gate import DefragScreen, no_moves_after_exit
from shared.policy.migration.planner import MigrationParams, plan_after_exit, plan_defrag
from shared.policy.migration.pull import hostable_on
from shared.policy.snapshot import ClusterSnapshot, GpuView, snapshot_of

pytestmark = pytest.mark.unit

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# random_instances moves jobs last at -inf, 970 or 500: at 1000 a 120 s cooldown holds the 970 ones back
NOW = 1000.0
NOWS = st.sampled_from([1000.0, 1089.0, 1090.0, 1200.0])


@SETTINGS
@given(snap=clusters(max_gpus=25), params=MIGRATION_PARAMS, now=NOWS, cooldown_mode=st.booleans())
def test_the_screen_says_no_moves_only_when_the_planner_plans_none(
    snap: ClusterSnapshot, params: MigrationParams, now: float, cooldown_mode: bool
) -> None:
    index = _keyed(snap, params.threshold, params.cooldown_s if cooldown_mode else None, now)
    for g in snap.gpus:
        planned = plan_after_exit(snap, g.id, now, params)
        if no_moves_after_exit(g, GEO.model(g.model), snap.model_list, index, now, params):
            assert planned == ()
        assert plan_after_exit(snap, g.id, now, params, pulls=index) == planned


@SETTINGS
@given(snap=clusters(max_gpus=25), params=MIGRATION_PARAMS, now=NOWS)
def test_a_defragmentation_with_a_cooldown_index_plans_what_it_plans_without_one(
    snap: ClusterSnapshot, params: MigrationParams, now: float
) -> None:
    index = _keyed(snap, params.threshold, params.cooldown_s, now)
    assert plan_defrag(snap, now, params, pulls=index) == plan_defrag(snap, now, params)


@SETTINGS
@given(snap=clusters(max_gpus=25), then=st.floats(900.0, 1300.0), later=st.floats(0.0, 300.0),
       threshold=st.sampled_from([0.0, 0.4]), cooldown_s=st.sampled_from([0.0, 29.999999999, 30.0, 120.0]))
def test_a_cooldown_index_followed_through_time_equals_one_keyed_afresh(
    snap: ClusterSnapshot, then: float, later: float, threshold: float, cooldown_s: float
) -> None:
    index = _keyed(snap, threshold, cooldown_s, then)
    for now in (then + later / 2, then + later):
        for p in index.due(now):
            index.update(p, snap.gpus[p], now)
        assert index.sources() == _keyed(snap, threshold, cooldown_s, now).sources()


def test_a_source_whose_jobs_all_cool_down_has_no_head_until_the_cooldown_ends() -> None:
    model = GEO.model("A100-40GB")
    insts = [i for i in random_instances(random.Random(3), model, "b", 1.0, 0.0)]
    busy = GpuView.build(id="b", node="n", index=0, model=model.name, instances=[
        i.__class__(**{**{f: getattr(i, f) for f in i.__struct_fields__}, "migratable": True,
                       "latency_sensitive": False, "last_moved_at": 950.0}) for i in insts])
    lazy = GpuView.build(id="l", node="n", index=1, model=model.name)
    snap = snapshot_of(GEO, [busy, lazy])
    params = MigrationParams(cooldown_s=120.0)
    index = _keyed(snap, params.threshold, params.cooldown_s, 1000.0)
    assert index.sources() == {}
    assert no_moves_after_exit(lazy, model, snap.model_list, index, 1000.0, params)
    assert plan_after_exit(snap, "l", 1000.0, params) == ()
    assert index.due(1069.0) == [] and index.due(1070.0) == [0]
    index.update(0, busy, 1070.0)
    index.follow(snap)
    assert list(index.sources()) == [0]
    assert not no_moves_after_exit(lazy, model, snap.model_list, index, 1070.0, params)
    assert plan_after_exit(snap, "l", 1070.0, params, pulls=index) == plan_after_exit(snap, "l", 1070.0, params) != ()


def _screen(snap: ClusterSnapshot, params: MigrationParams) -> DefragScreen:
    screen = DefragScreen(params, snap.model_list, len(snap))
    for p, g in enumerate(snap.gpus):
        screen.update(p, g, GEO.model(g.model))
    return screen


@SETTINGS
@given(snap=clusters(max_gpus=25), params=MIGRATION_PARAMS, now=NOWS, cooldown_mode=st.booleans())
def test_the_defragmentation_screen_says_no_moves_only_when_the_planner_plans_none(
    snap: ClusterSnapshot, params: MigrationParams, now: float, cooldown_mode: bool
) -> None:
    index = _keyed(snap, params.threshold, params.cooldown_s if cooldown_mode else None, now)
    if _screen(snap, params).no_moves(index, now):
        assert plan_defrag(snap, now, params) == ()


@SETTINGS
@given(snap=clusters(max_gpus=25), seeds=st.lists(st.integers(0, 2**16), min_size=1, max_size=3),
       params=MIGRATION_PARAMS)
def test_a_screen_updated_with_the_changed_gpus_only_equals_one_built_from_scratch(
    snap: ClusterSnapshot, seeds: list[int], params: MigrationParams
) -> None:
    screen = _screen(snap, params)
    for seed in seeds:
        rng = random.Random(seed)
        gpus = list(snap.gpus)
        for p, g in enumerate(gpus):
            if rng.random() < 0.3:
                model = GEO.model(g.model)
                gpus[p] = g.with_instances(random_instances(rng, model, f"{g.id}x{seed}", rng.random(), 0.3))
                screen.update(p, gpus[p], model)
        snap = snapshot_of(GEO, gpus)
        assert screen.state() == _screen(snap, params).state()


@SETTINGS
@given(snap=clusters(max_gpus=25), seeds=st.lists(st.integers(0, 2**16), min_size=1, max_size=5),
       threshold=st.sampled_from([0.2, 0.4]), cooldown_mode=st.booleans())
def test_any_head_says_whether_the_heads_yield_anything_through_changes(
    snap: ClusterSnapshot, seeds: list[int], threshold: float, cooldown_mode: bool
) -> None:
    """Memoised answers (a group that had a source, or the groups seen when none had) stay right as groups
    appear and empty."""
    index = _keyed(snap, threshold, 120.0 if cooldown_mode else None, NOW)
    gpus = list(snap.gpus)
    targets = {(g.used_compute, GEO.model(g.model).compute_slices,
                hostable_on(index.memos, snap.model_list, GEO.model(g.model),
                            tuple((i.profile, i.start, i.job_id is not None) for i in g.instances)))
               for g in gpus}
    for seed in [*seeds, *seeds]:
        for t in targets:
            assert index.any_head(*t) == any(True for _ in index.heads(*t))
        rng = random.Random(seed)
        for p, g in enumerate(gpus):
            if rng.random() < 0.3:
                model = GEO.model(g.model)
                gpus[p] = g.with_instances(random_instances(rng, model, f"{g.id}x{seed}", rng.random(), 0.2))
                index.update(p, gpus[p], NOW)
