"""The simulator's shortcuts on the migration path decide what the long way decides: the exit screen with the
defragmentation screen's intra bounds (for a Busy GPU) says "no moves" only when the planner plans none; a
placement index told that only instance times changed (``retime``) places as one built afresh."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mig_strategies import GEO, MIGRATION_PARAMS, clusters, keyed_pull_index, random_cluster

from shared.policy.migration.gate import DefragScreen, no_moves_after_exit
from shared.policy.migration.planner import MigrationParams, plan_after_exit
from shared.policy.placement.balancer import BalancerParams
from shared.policy.placement.index import PlacementIndex
from shared.policy.request import mig
from shared.policy.snapshot import ClusterSnapshot, GpuView

pytestmark = pytest.mark.unit

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(snap=clusters(max_gpus=25), params=MIGRATION_PARAMS, now=st.sampled_from([1000.0, 1090.0, 1200.0]))
def test_exit_screen_with_intra_bounds_says_no_moves_only_when_the_planner_plans_none(
    snap: ClusterSnapshot, params: MigrationParams, now: float
) -> None:
    index = keyed_pull_index(snap, params.threshold, params.cooldown_s, now)
    screen = DefragScreen(params, snap.model_list, len(snap))
    for g in snap.gpus:
        model = GEO.model(g.model)
        plain = no_moves_after_exit(g, model, snap.model_list, index, now, params)
        bounded = no_moves_after_exit(g, model, snap.model_list, index, now, params, screen=screen)
        assert bounded or not plain  # the intra bound only adds "no moves" answers
        if bounded:
            assert plan_after_exit(snap, g.id, now, params, pulls=index) == ()

def _retimed(gpu: GpuView, rng: random.Random) -> GpuView:
    return msgspec.structs.replace(gpu, instances=tuple(
        msgspec.structs.replace(i, started_at=rng.uniform(0, 2000), last_moved_at=rng.uniform(0, 2000))
        if rng.random() < 0.5 else i for i in gpu.instances))


@SETTINGS
@given(seed=st.integers(0, 2**16), n=st.integers(1, 30), rank=st.sampled_from(["absolute", "delta"]))
def test_placement_index_retimed_gpus_place_as_an_index_built_afresh(seed: int, n: int, rank: str) -> None:
    rng = random.Random(seed)
    gpus = list(random_cluster(rng, n).gpus)
    params = BalancerParams(rank=rank)  # type: ignore[arg-type]
    index = PlacementIndex(GEO, gpus, params)
    for _ in range(3):
        for shape in ("1g", "2g", "3g", "7g", "1g.2x"):
            assert index.place(mig(shape)) == PlacementIndex(GEO, gpus, params).place(mig(shape))
        for p, g in enumerate(gpus):
            if rng.random() < 0.5:
                gpus[p] = _retimed(g, rng)
                index.retime(p, gpus[p])
        assert index.agrees_with(gpus)
