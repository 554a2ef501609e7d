"""``load/bench_gangs.py``: the gang benchmark's figures mean what its table says."""

from __future__ import annotations

import pytest

from load.bench_gangs import COLUMNS, run

pytestmark = pytest.mark.unit


def _figures(label: str) -> dict[str, float]:
    return dict(zip(COLUMNS, run(128, 1, label, jobs=600, load=1.0, patience_s=86400.0), strict=True))


def test_a_rejected_gang_counts_at_its_patience_and_only_reservations_hold_gpus_idle() -> None:
    held, greedy = _figures("migsched"), _figures("migsched[reserve=off]")
    # over 5 % of the big gangs are turned away without holds, so the p95 is a rejected gang's full patience
    assert greedy["big rejected"] > 0.05 and greedy["big wait p95 h"] == pytest.approx(24.0)
    assert held["big rejected"] < greedy["big rejected"]
    assert held["held idle"] > 0.0 and greedy["held idle"] == 0.0
    assert held["small wait mean s"] > 0.0 and held["rejected"] <= greedy["rejected"]
