"""load/bench_rewrite.py lays the ended jobs out as named and measures a real rewrite."""

from __future__ import annotations

import json
import shutil

import pytest

from load.bench_rewrite import _HIST, job_fields, measure
from shared.state.codec import history_raw

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs a redis-server binary"),
]


def test_each_layout_leaves_its_own_keys_and_a_rewrite_is_measured() -> None:
    fields, listed, nojobs = (measure(layout, 300) for layout in ("fields", "list", "nojobs"))
    assert fields["keys"] == 300 + 2  # a hash per job, :jobs, :done
    assert listed["keys"] == 2 * 300 + 2  # and a history list per job
    assert nojobs["keys"] == 2 * 300 + 1
    assert fields["mib"] < listed["mib"]
    assert all(m["child_cpu_s"] >= 0 and m["rewrite_s"] > 0 for m in (fields, listed, nojobs))


def test_the_history_fields_read_back_in_order() -> None:
    h = {**job_fields(1), "hn": 3, **{f"h{k + 1}": v for k, v in enumerate(_HIST)}}
    assert [json.loads(x)["to"] for x in history_raw(h)] == ["placing", "running", "finished"]
