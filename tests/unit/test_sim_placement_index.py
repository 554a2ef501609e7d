"""The simulator's placement indexes (the balancer family's and ``migsched``'s) change the speed of a run, never
its outcome."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from shared.mig.geometry import default_geometry
from shared.policy.placement.registry import get_policy, parse_label
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
    cfg = SimConfig(seed=seed, check_invariants=True)
    name, extra = parse_label(policy)
    spec, pol = get_policy(name, **{**experiment.policy_params(name, wl, cfg), **extra})
    sim = Simulator(wl, cluster, spec, pol, cfg, geometry=GEO)
    assert (sim.placer is not None) == (policy not in ("first-fit", "migsched[spread=on]"))
    if not index:  # every request goes to the policy with a snapshot, as before the index existed
        sim.placer = None
        sim.cluster.index = None
    return sim.run()


@pytest.mark.parametrize("policy", ["paper-nomig", "paper", "paper-pack", "migsched", "migsched[reserve=off]",
                                    "migsched[in_time=off,node_first=on]"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_run_with_the_placement_index_has_the_same_kpis_and_series_as_one_asking_the_policy(
    policy: str, seed: int
) -> None:
    fast, slow = _run(policy, seed, index=True), _run(policy, seed, index=False)
    assert fast.kpis.events > 400
    assert msgspec.structs.replace(fast.kpis, wall_s=0.0) == msgspec.structs.replace(slow.kpis, wall_s=0.0)
    assert fast.series == slow.series
    assert fast.jct == slow.jct


@pytest.mark.parametrize("policy", ["first-fit", "migsched[spread=on]"])
def test_a_policy_no_index_answers_for_gets_none(policy: str) -> None:
    _run(policy, 0, index=True)
