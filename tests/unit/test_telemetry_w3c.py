"""Without a tracer provider the bus reads and writes ``traceparent`` itself (shared/telemetry.py): it must
carry a trace exactly as the OpenTelemetry propagator does, and drop what the propagator drops."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import propagate, trace

from shared import telemetry

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def not_recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(telemetry, "_recording", False)
    yield


@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": TP},
        {"traceparent": TP, "tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"},
        {"traceparent": TP.replace("-01", "-00")},
        {"traceparent": "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra"},
    ],
)
def test_a_trace_travels_as_the_propagator_carries_it(not_recording: None, headers: dict[str, str]) -> None:
    ctx = telemetry.extract(headers)
    ours: dict[str, str] = {}
    telemetry.inject(ours, ctx)
    theirs: dict[str, str] = {}
    propagate.inject(theirs, context=propagate.extract(headers))
    assert ours == theirs
    assert trace.get_current_span(ctx).get_span_context() == trace.get_current_span(
        propagate.extract(headers)
    ).get_span_context()


@pytest.mark.parametrize(
    "value",
    [
        "",
        "garbage",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",  # a field short
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",  # version 00 has four fields
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # all-zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # all-zero span id
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # forbidden version
        "00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",  # not hex
    ],
)
def test_a_malformed_traceparent_starts_no_trace(not_recording: None, value: str) -> None:
    ctx = telemetry.extract({"traceparent": value})
    assert not trace.get_current_span(ctx).get_span_context().is_valid
    assert not trace.get_current_span(propagate.extract({"traceparent": value})).get_span_context().is_valid
    out: dict[str, str] = {}
    telemetry.inject(out, ctx)
    assert out == {}
