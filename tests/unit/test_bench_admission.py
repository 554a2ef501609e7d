"""``load/bench_admission.py``: the two ways it times decide every job alike, so the table compares cost only."""

from __future__ import annotations

from pathlib import Path

import pytest

from load.bench_admission import run

pytestmark = pytest.mark.unit


def test_the_index_and_the_copied_snapshot_place_every_job_alike(tmp_path: Path) -> None:
    _, over_snapshot = run(96, 60, False, tmp_path)
    _, through_index = run(96, 60, True, tmp_path)
    assert through_index == over_snapshot
    assert sum(1 for c in over_snapshot if isinstance(c, tuple)) > 30  # most are placed, some may wait
