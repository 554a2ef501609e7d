"""``load/bench_sim.py``: the simulator-speed benchmark's plain run (``--no-breakdown``) and its timed run
simulate the same thing; only the timed one reports where the time went."""

from __future__ import annotations

import pytest

from load.bench_sim import bench
from shared.sim import moves

pytestmark = pytest.mark.unit

_TOTALS = ("events", "completed", "rejected", "utilization")
_BREAKDOWN = (
    "policy_s", "policy_calls", "planner_s", "snapshot_s", "snapshot_calls", "screens_s", "screens_calls", "moves_s",
    "moves_calls", "moves_started", "sim_own_events_per_s",
)


def test_a_run_without_the_breakdown_simulates_the_same_events_and_kpis_and_reports_no_breakdown() -> None:
    timed = bench("paper", jobs=400, gpus=8, load=0.85, seed=3, profile=False)
    plain = bench("paper", jobs=400, gpus=8, load=0.85, seed=3, profile=False, breakdown=False)
    assert {k: plain[k] for k in _TOTALS} == {k: timed[k] for k in _TOTALS}
    assert plain["events"] > 400  # arrivals alone are 400: exits (and moves) were simulated too
    assert all(k in timed for k in _BREAKDOWN)
    assert not any(k in plain for k in _BREAKDOWN)


def test_the_timed_run_counts_a_policy_call_for_every_completed_job_and_its_snapshots() -> None:
    timed = bench("paper", jobs=400, gpus=8, load=0.85, seed=3, profile=False)
    assert timed["policy_calls"] >= timed["completed"]  # every completed job was placed by a policy call
    assert timed["snapshot_calls"] > 0


def test_the_timed_run_clocks_the_screens_and_moves_of_a_migrating_policy_and_none_without_migration() -> None:
    mig = bench("paper", jobs=400, gpus=8, load=0.85, seed=3, profile=False)
    nomig = bench("paper-nomig", jobs=400, gpus=8, load=0.85, seed=3, profile=False)
    assert mig["moves_started"] > 0
    assert mig["screens_calls"] > 0
    assert mig["moves_calls"] >= mig["moves_started"]  # every started move ends in a done-event call
    assert (nomig["screens_calls"], nomig["moves_calls"], nomig["moves_started"]) == (0, 0, 0)


def test_the_timed_run_leaves_the_move_functions_as_it_found_them() -> None:
    before = (moves.try_move, moves.on_move_done, moves.no_moves_after_exit)
    bench("paper", jobs=200, gpus=4, load=0.85, seed=1, profile=False)
    assert (moves.try_move, moves.on_move_done, moves.no_moves_after_exit) == before


def test_a_policy_label_with_parameters_runs_that_variant() -> None:
    held = bench("migsched", jobs=400, gpus=8, load=1.3, seed=3, profile=False, breakdown=False)
    plain = bench("migsched[reserve=off]", jobs=400, gpus=8, load=1.3, seed=3, profile=False, breakdown=False)
    assert plain["policy"] == "migsched[reserve=off]"
    assert {k: plain[k] for k in _TOTALS} != {k: held[k] for k in _TOTALS}  # reservations change the run
