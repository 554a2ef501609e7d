"""A job's trace starts at its publisher even where nothing is exported: the submit carries a new trace id."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]

# in a fresh process: no tracer provider installed, as in a publisher that exports nothing
_CODE = """
from opentelemetry import trace
from shared import telemetry
assert not telemetry.recording()
seen = set()
for _ in range(3):
    with telemetry.tracer().start_as_current_span("submit", context=telemetry.publisher_context()):
        headers = {}
        telemetry.inject(headers)
        seen.add(headers["traceparent"].split("-")[1])
    # inside a caller's span the publisher joins the caller's trace instead
    outer = telemetry.publisher_context()
    with trace.use_span(trace.get_current_span(outer)):
        assert telemetry.publisher_context() is None
print(len(seen))
"""


def test_each_submit_without_an_sdk_starts_its_own_trace_and_sends_it() -> None:
    out = subprocess.run([sys.executable, "-c", _CODE], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "3"
