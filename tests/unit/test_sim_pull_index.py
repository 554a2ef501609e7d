"""The simulator's pull-source index changes the speed of a migrating run, never its outcome."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from shared.mig.geometry import default_geometry
from shared.policy.placement.registry import get_policy
from shared.sim import experiment
from shared.sim.cluster import parse_cluster
from shared.sim.config import SimConfig
from shared.sim.engine import Simulator
from shared.sim.metrics import RunResult
from shared.sim.workloads.synthetic import synthetic

pytestmark = pytest.mark.unit

GEO = default_geometry()


def _run(policy: str, seed: int, *, index: bool) -> RunResult:
    cluster = parse_cluster(["A100-40GB:12", "H100-80GB:6"], GEO, 4)
    wl = synthetic(np.random.default_rng(seed), jobs=400, load=1.2, cluster_slices=18 * 7)
    # invariant checks compare the kept index with one rebuilt from scratch after every event
    cfg = SimConfig(seed=seed, check_invariants=index)
    spec, pol = get_policy(policy, **experiment.policy_params(policy, wl, cfg))
    sim = Simulator(wl, cluster, spec, pol, cfg, geometry=GEO)
    assert sim.cluster.pulls is not None
    if not index:  # every pull screens the snapshot's columns, as before the index existed
        sim.cluster.pulls = None
    return sim.run()


@pytest.mark.parametrize("policy", ["paper", "paper-pack"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_run_with_the_pull_index_has_the_same_kpis_and_series_as_one_without(policy: str, seed: int) -> None:
    fast, slow = _run(policy, seed, index=True), _run(policy, seed, index=False)
    assert fast.kpis.migrations > 0
    assert msgspec.structs.replace(fast.kpis, wall_s=0.0) == msgspec.structs.replace(slow.kpis, wall_s=0.0)
    assert fast.series == slow.series
    assert fast.jct == slow.jct


def test_a_policy_without_migration_keeps_no_pull_index() -> None:
    cluster = parse_cluster(["A100-40GB:4"], GEO, 4)
    wl = synthetic(np.random.default_rng(0), jobs=20, load=1.0, cluster_slices=4 * 7)
    cfg = SimConfig(seed=0)
    spec, pol = get_policy("paper-nomig", **experiment.policy_params("paper-nomig", wl, cfg))
    assert Simulator(wl, cluster, spec, pol, cfg, geometry=GEO).cluster.pull_index() is None
