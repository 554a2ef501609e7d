"""Simulator speed: scheduling events per second of wall time (budget: >= 50,000 on one core).

    .venv/bin/python load/bench_sim.py --jobs 100000 --gpus 1000 --policy paper-nomig
    .venv/bin/python load/bench_sim.py --jobs 20000 --gpus 1000 --policy paper --profile
    .venv/bin/python load/bench_sim.py --policy migsched --policy 'migsched[reserve=off]'   # a variant by label

Prints one JSON object per policy: events, wall_s, events_per_s, cpu_s and events_per_cpu_s (process CPU time
of the run: the fairer figure on a shared machine), and the share of wall time spent inside the
placement policy (for the balancer family, mostly the simulator's ``PlacementIndex``, which answers MIG
requests exactly as ``balancer.place`` would) and the migration planner, so the simulator's own overhead per
event is visible too. With migration the planner is handed the simulator's pull-source index
(``shared/policy/migration/pull_index.py``); its time excludes the snapshot flush and index sync before each plan, and
the exact screens that answer most exits and ticks without a plan (``shared/policy/migration/gate.py``), which
count as the simulator's own; ``snapshot_s`` is the time spent taking builder snapshots (their flush),
``screens_s`` the time in those screens and the indexes they keep up to date, ``moves_s`` the time spent
starting moves and completing them (the backfill pass a completed move triggers included). The events and KPIs
are the same with and without either index (tests/unit/test_sim_placement_index.py, test_sim_pull_index.py).
``--no-breakdown`` runs the plain simulator, no timer around any call, and prints the totals only: the
figure to hold against the budget (the timers cost 1-4 % of a run).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest.mock import patch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec
import numpy as np

from shared.mig.geometry import default_geometry
from shared.policy.placement.registry import get_policy, parse_label
from shared.sim import experiment, moves
from shared.sim.cluster import parse_cluster
from shared.sim.config import SimConfig
from shared.sim.engine import Simulator
from shared.sim.metrics import Kpis
from shared.sim.workloads.synthetic import synthetic


class Group:
    """One clock for one or several callables: the wall time spent inside any of them and the calls, a call
    made from inside another member counted once (a move's backfill pass starts the next move of its chain)."""

    def __init__(self) -> None:
        self.total, self.calls, self._depth = 0.0, 0, 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            if self._depth:
                return fn(*a, **k)
            self._depth += 1
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.total += time.perf_counter() - t
                self.calls += 1
                self._depth -= 1

        return timed


@contextmanager
def _migration_clocks(sim: Simulator) -> Iterator[tuple[Group, Group]]:
    """Time the migration path's two parts that are neither the planner nor a snapshot flush: the exact
    screens with the indexes they keep (pull index, defragmentation screen, the planner's light snapshot), and
    the moves' execution (starting each, and its done-event with the backfill pass it triggers). Module-level
    functions are patched for the run only."""
    screens, moving = Group(), Group()
    c = sim.cluster
    for name in ("current_pulls", "defrag_screen", "planner_snapshot"):
        setattr(c, name, screens.wrap(getattr(c, name)))
    with ExitStack() as stack:
        stack.enter_context(patch.object(moves, "no_moves_after_exit", screens.wrap(moves.no_moves_after_exit)))
        if c.screen is not None:
            c.screen.no_moves = screens.wrap(c.screen.no_moves)  # type: ignore[method-assign]
        if c.pulls is not None:
            c.pulls.follow = screens.wrap(c.pulls.follow)  # type: ignore[method-assign]
        stack.enter_context(patch.object(moves, "try_move", moving.wrap(moves.try_move)))
        stack.enter_context(patch.object(moves, "on_move_done", moving.wrap(moves.on_move_done)))
        yield screens, moving


def bench(
    policy: str, jobs: int, gpus: int, load: float, seed: int, profile: str | None, breakdown: bool = True
) -> dict[str, object]:
    geo = default_geometry()
    cluster = parse_cluster([f"A100-40GB:{gpus}"], geo, 8)
    t0 = time.perf_counter()
    wl = synthetic(np.random.default_rng(seed), jobs=jobs, load=load, cluster_slices=gpus * 7)
    gen_s = time.perf_counter() - t0
    cfg = SimConfig(seed=seed)
    name, params = parse_label(policy)  # a label with parameters, as `migsched simulate -p` takes
    spec, pol = get_policy(name, **{**experiment.policy_params(name, wl, cfg), **params})
    if name in experiment.LAYOUT_POLICIES:
        spec = msgspec.structs.replace(spec, initial_layout=cfg.static_layout)
    if not breakdown:  # the plain simulator, no timer around any call: the headline figure alone
        sim = Simulator(wl, cluster, spec, pol, cfg, geometry=geo)
        k, cpu_s = _run(sim, profile)
        return _totals(policy, jobs, gpus, load, gen_s, k, cpu_s)
    policy_clock, planner_clock, snap_clock = Group(), Group(), Group()
    timed = policy_clock.wrap(pol)
    for index_params in ("balancer_params", "align_params"):  # what the engine picks its index by
        if hasattr(pol, index_params):
            setattr(timed, index_params, getattr(pol, index_params))
    sim = Simulator(wl, cluster, spec, timed, cfg, geometry=geo)
    if sim.placer is not None:  # MIG decisions go to the incremental index: time it as the policy too
        sim.placer.place = policy_clock.wrap(sim.placer.place)  # type: ignore[method-assign]
    if sim.mig is not None:
        import types

        sim.mig = types.SimpleNamespace(  # type: ignore[assignment]
            plan_after_exit=planner_clock.wrap(sim.mig.plan_after_exit),
            plan_defrag=planner_clock.wrap(sim.mig.plan_defrag),
        )
    # snapshots (the builder flush they trigger) and pull-index syncs count as the simulator's own time; shown
    # apart so that the cost of keeping the planner's inputs is visible
    sim.cluster.snapshot = snap_clock.wrap(sim.cluster.snapshot)  # type: ignore[method-assign]
    with _migration_clocks(sim) as (screens, moving):
        k, cpu_s = _run(sim, profile)
    plan_s = planner_clock.total
    own = max(k.wall_s - policy_clock.total - plan_s, 1e-9)
    out = _totals(policy, jobs, gpus, load, gen_s, k, cpu_s)
    out.update(
        {
            "policy_s": round(policy_clock.total, 2),
            "policy_calls": policy_clock.calls,
            "policy_us_per_call": round(policy_clock.total / max(policy_clock.calls, 1) * 1e6, 1),
            "planner_s": round(plan_s, 2),
            "snapshot_s": round(snap_clock.total, 2),
            "snapshot_calls": snap_clock.calls,
            "screens_s": round(screens.total, 2),
            "screens_calls": screens.calls,
            "moves_s": round(moving.total, 2),
            "moves_calls": moving.calls,
            "moves_started": sim.moves_started,
            "sim_own_events_per_s": round(k.events / own),
        }
    )
    return out


def _run(sim: Simulator, profile: str | None) -> tuple[Kpis, float]:
    """Run ``sim``; its KPIs and the process CPU time the run took."""
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    cpu0 = time.process_time()
    r = sim.run()
    cpu_s = time.process_time() - cpu0
    if prof:
        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats(profile).print_stats(30)
    return r.kpis, cpu_s


def _totals(policy: str, jobs: int, gpus: int, load: float, gen_s: float, k: Kpis, cpu_s: float) -> dict[str, object]:
    return {
        "policy": policy,
        "jobs": jobs,
        "gpus": gpus,
        "load": load,
        "events": k.events,
        "wall_s": k.wall_s,
        "events_per_s": round(k.events / k.wall_s),
        "cpu_s": round(cpu_s, 3),
        "events_per_cpu_s": round(k.events / max(cpu_s, 1e-9)),
        "completed": k.completed,
        "rejected": k.rejected,
        "utilization": k.utilization,
        "workload_gen_s": round(gen_s, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--load", type=float, default=0.85)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy", action="append", default=None)
    ap.add_argument("--profile", nargs="?", const="tottime", choices=("tottime", "cumulative"),
                    help="print the top 30 functions by this time to stderr (default: tottime)")
    ap.add_argument(
        "--no-breakdown",
        dest="breakdown",
        action="store_false",
        help="no timers around the policy, planner and snapshots: only the totals, from the plain "
        "simulator (the timers cost 1-4 %% of a run)",
    )
    a = ap.parse_args()
    for p in a.policy or ["migsched"]:
        print(json.dumps(bench(p, a.jobs, a.gpus, a.load, a.seed, a.profile, a.breakdown)), flush=True)


if __name__ == "__main__":
    main()
