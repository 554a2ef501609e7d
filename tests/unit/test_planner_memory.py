"""The migration planner's memos across plans stay within their bounds whatever GPU states come by, keep the keys
asked again, answer as a fresh computation does, and are state their caller owns."""

from __future__ import annotations

import random

import pytest
from mig_strategies import GEO, random_instances

from shared.policy.migration import pull as migration_pull
from shared.policy.migration.memos import DEFAULT_SIZE, Memo, PlannerMemos
from shared.policy.migration.planner import MigrationParams, plan_after_exit, plan_defrag
from shared.policy.migration.pull import _hostable, hostable_on
from shared.policy.migration.pull_index import PullIndex
from shared.policy.migration.search import VirtualGpu
from shared.policy.migration.state import PlanState, _dst_placement
from shared.policy.snapshot import ClusterSnapshot, GpuView, SnapshotBuilder, snapshot_of

pytestmark = pytest.mark.unit
A100 = GEO.model("A100-40GB")


def test_a_key_asked_again_within_its_size_stays_and_one_offs_go() -> None:
    memo: Memo[str, int] = Memo(4)
    memo.put("hot", 0)
    for i in range(100):
        memo.put(f"once-{i}", i)
        if i % 3 == 0:  # asked once every 3 new keys (< 4): never dropped
            assert memo.get("hot") == 0
        assert len(memo) <= 8
    assert memo.get("hot") == 0
    assert memo.get("once-0") is None and memo.get("once-99") == 99


def test_the_memo_is_full_after_size_new_keys_and_never_holds_more_than_twice_that() -> None:
    memo: Memo[int, int] = Memo(16)
    sizes = []
    for i in range(1000):
        memo.put(i, i)
        sizes.append(len(memo))
    assert max(sizes) <= 32 and min(sizes[16:]) >= 16


def test_a_hit_in_the_previous_generation_is_carried_over() -> None:
    memo: Memo[str, int] = Memo(2)
    memo.put("a", 1)
    memo.put("b", 2)  # "a" and "b" are the previous generation now
    assert memo.get("a") == 1  # carried into the current one
    memo.put("c", 3)  # current full: previous = {a, c}, "b" goes later
    memo.put("d", 4)
    memo.put("e", 5)  # previous = {d, e}: "a" and "c" are gone, "b" long gone
    assert [memo.get(k) for k in "abcde"] == [None, None, None, 4, 5]
    memo.clear()
    assert len(memo) == 0


def test_a_nonsense_size_is_refused() -> None:
    with pytest.raises(ValueError):
        Memo(0)
    with pytest.raises(ValueError):
        PlannerMemos(0)


def _gpu(rng: random.Random, i: int) -> GpuView:
    return GpuView.build(id=f"n/{i}", node="n", index=0, model=A100.name,
                         instances=random_instances(rng, A100, f"n/{i}", rng.random(), 0.3))


def _cluster(seed: int, n: int = 64) -> ClusterSnapshot:
    rng = random.Random(seed)
    return snapshot_of(GEO, [
        GpuView.build(id=f"n/{i}", node="n", index=0, model=A100.name,
                      instances=random_instances(rng, A100, f"n/{i}", rng.uniform(0.3, 0.9), 0.2))
        for i in range(n)
    ])


def test_many_distinct_gpu_states_keep_the_planner_memos_within_their_bounds_and_their_answers_right() -> None:
    memos = PlannerMemos(64)
    rng = random.Random(7)
    models = (A100,)
    state = PlanState.__new__(PlanState)  # dst_placement reads only the memos
    state.memos = memos
    seen = []
    for i in range(1500):  # ~1,000 distinct states, and repeats
        view = _gpu(rng, i)
        t = VirtualGpu(view, A100, 0)
        seen.append(t.signature())
        for _ in range(2):  # the second time from the memo
            assert hostable_on(memos, models, A100, t.signature()) == _hostable(models, A100, t.signature())
            for src in A100.profiles:
                assert state.dst_placement(t, src) == _dst_placement(t, src)
        assert len(memos.hostable) <= 128 and len(memos.dst) <= 128
    assert len(set(seen)) > 500


def test_the_memos_are_the_callers_and_change_no_plan() -> None:
    snap, params = _cluster(5), MigrationParams()
    mine, other = PlannerMemos(), PlannerMemos()
    fresh = [plan_after_exit(snap, g.id, 1e9, params) for g in snap.gpus]  # each plan with its own memos
    kept = [plan_after_exit(snap, g.id, 1e9, params, memos=mine) for g in snap.gpus]
    again = [plan_after_exit(snap, g.id, 1e9, params, memos=mine) for g in snap.gpus]  # from the memos
    assert fresh == kept == again and any(fresh)
    assert plan_defrag(snap, 1e9, params, memos=mine) == plan_defrag(snap, 1e9, params)
    assert len(mine.dst) and len(mine.view_jobs)
    assert len(other.dst) == len(other.hostable) == len(other.view_jobs) == 0  # nothing shared behind them
    pulls = PullIndex(params.threshold)
    assert pulls.memos is not mine and pulls.memos.size == DEFAULT_SIZE  # the simulator's index keeps its own


def test_the_hostable_answers_are_cached_once() -> None:
    # the memo in front of _hostable is its only cache (an lru_cache behind it held every entry twice)
    assert not hasattr(migration_pull._hostable, "cache_info")


def test_the_jobs_memoised_per_view_go_with_the_view() -> None:
    # a service builds every snapshot anew: entries kept after their views had held those views (and the
    # pymalloc arenas of their snapshots) for up to 4,096 entries; the simulator's views live on and hit again
    snap = _cluster(3)
    params = MigrationParams()
    memos = PlannerMemos()

    def plan(s: ClusterSnapshot) -> None:
        for g in s.gpus:
            plan_after_exit(s, g.id, 1e9, params, memos=memos)

    plan(snap)
    ids = {id(g) for g in snap.gpus}
    cached = [k for k in ids if k in memos.view_jobs]
    assert cached
    entry = memos.view_jobs._by_id[cached[0]]
    plan(snap)
    assert memos.view_jobs._by_id[cached[0]] is entry  # hit again while the view lives
    del snap, entry
    assert not any(k in memos.view_jobs for k in ids)


def test_small_planner_memos_hold_at_most_twice_their_size() -> None:
    memos = PlannerMemos(4)
    for k in range(50):
        memos.dst.put((k, (), 0), None)  # type: ignore[arg-type]
        memos.hostable.put(((), k, ()), None)  # type: ignore[arg-type]
    assert len(memos.dst) <= 8 and len(memos.hostable) <= 8


def test_a_builder_keeps_at_most_its_bound_of_drop_rows_and_its_column_is_a_fresh_computation() -> None:
    builder = SnapshotBuilder(GEO)
    builder.drop_row_limit = 16
    rng = random.Random(11)
    for i in range(300):  # far more distinct GPU states than the bound
        builder.put(_gpu(rng, i % 40))
        assert len(builder._drops) <= 16
    snap = builder.snapshot()
    fresh = snapshot_of(GEO, snap.gpus)  # a fresh builder: every row computed anew
    assert (snap.movable_drops == fresh.movable_drops).all()


def test_no_module_keeps_gpu_states_for_the_drop_rows() -> None:
    from shared.policy import snapshot_columns as sc

    assert not [n for n, v in vars(sc).items() if isinstance(v, dict) and not n.startswith("__")]
