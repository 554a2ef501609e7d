"""``load/bench_gangs.py``: the gang benchmark's figures mean what its table says."""

from __future__ import annotations

import pytest

from load.bench_gangs import COLUMNS, paired, run

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


def test_a_difference_to_the_reference_is_paired_seed_by_seed() -> None:
    def figures(big: float, p95: float, small: float) -> list[float]:
        row = [0.0] * len(COLUMNS)
        row[COLUMNS.index("big rejected")], row[COLUMNS.index("big wait p95 h")] = big, p95
        row[COLUMNS.index("small wait mean s")] = small
        return row

    mine = [figures(0.01, 20.0, 30.0), figures(0.03, 18.0, 40.0)]
    ref = [figures(0.02, 19.0, 10.0), figures(0.02, 19.0, 20.0)]
    d = paired(mine, ref)
    assert d["big rejected"] == pytest.approx((0.0, 0.01))  # -0.01 then +0.01
    assert d["big wait p95 h"] == pytest.approx((0.0, 1.0))
    assert d["small wait mean s"] == pytest.approx((20.0, 0.0))  # the same gap in both: no spread
