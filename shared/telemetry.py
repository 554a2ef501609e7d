"""OpenTelemetry set-up. Tracing lives in the bus adapters (``shared.bus``), never in policies.

``setup(service)`` installs a tracer provider once per process: OTLP/HTTP export (batch processor) when
``MIGSCHED_OTLP_ENDPOINT`` is set; otherwise none, and nothing records: ``recording()`` is False, the bus then
creates no span per message and ``extract``/``inject`` read and write the W3C ``traceparent`` directly (a
third of the propagator API's cost), so that the trace still continues across hops for almost nothing.
Tests pass their own ``SpanExporter`` (e.g. ``InMemorySpanExporter``) to see the spans.
W3C ``traceparent`` is the propagation format (the OpenTelemetry default).
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator, Mapping, MutableMapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

_installed: TracerProvider | None = None


def setup(
    service: str,
    endpoint: str | None = None,
    exporter: SpanExporter | None = None,
    sample_ratio: float = 1.0,
    synchronous: bool = False,
) -> TracerProvider | None:
    """Install (once) and return the process's tracer provider for ``service``.

    With neither an endpoint nor an exporter nothing is installed (None): the API's no-op tracer still carries
    the incoming ``traceparent`` through to the next hop, at a fraction of the SDK's cost per message.
    """
    global _installed, _recording
    _recording = None
    current = trace.get_tracer_provider()
    if _installed is None and isinstance(current, TracerProvider):
        _installed = current  # someone in this process (a test, an embedding app) installed one already
    if _installed is not None:
        if exporter is not None:
            _installed.add_span_processor(
                SimpleSpanProcessor(exporter) if synchronous else BatchSpanProcessor(exporter)
            )
        return _installed
    endpoint = endpoint if endpoint is not None else os.environ.get("MIGSCHED_OTLP_ENDPOINT", "")
    if not endpoint and exporter is None:
        return None
    provider = TracerProvider(
        resource=Resource.create({"service.name": service}),
        sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
    )
    if endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    if exporter is not None:
        provider.add_span_processor(
            SimpleSpanProcessor(exporter) if synchronous else BatchSpanProcessor(exporter)
        )
    trace.set_tracer_provider(provider)
    _installed = provider
    return provider


def publisher_context() -> otel_context.Context | None:
    """Where a publisher's root span (a job's submit) starts: the caller's context when it holds a span, or when
    this process records (the SDK then starts a new trace: None); otherwise a new random trace id, so that the
    job's trace begins at its publisher even in a process that exports nothing, and every hop joins it."""
    if recording() or trace.get_current_span().get_span_context().is_valid:
        return None
    sc = SpanContext(random.getrandbits(128) or 1, random.getrandbits(64) or 1, is_remote=False,
                     trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(sc), _EMPTY)


def shutdown() -> None:
    if _installed is not None:
        _installed.shutdown()


_recording: bool | None = None


def recording() -> bool:
    """Whether spans are recorded in this process (an SDK tracer provider is installed). Asked per message,
    so decided once (``get_tracer_provider`` costs a microsecond) and again after each ``setup``: a provider
    installed behind ``setup``'s back is not seen."""
    global _recording
    if _recording is None:
        _recording = _installed is not None or isinstance(trace.get_tracer_provider(), TracerProvider)
    return _recording


def tracer(name: str = "migsched") -> trace.Tracer:
    return trace.get_tracer(name)


_MAX_LINKS = 64


@contextlib.contextmanager
def step(name: str, contexts: Sequence[otel_context.Context | None],
         attributes: Mapping[str, str | int | float | bool] | None = None) -> Iterator[None]:
    """A span for one step taken for several messages at once (a batch's commit): the child of the first
    message's context, linked to the others' (so each job's trace finds it), and current while the step runs,
    so that what it calls (a Redis round trip) nests under it. Nothing when spans are not recorded, or when no
    message carries a context (a step of no job's story starts no trace of its own)."""
    ctxs = [c for c in contexts if c is not None] if recording() else []
    if not ctxs:
        yield
        return
    links = [trace.Link(trace.get_current_span(c).get_span_context()) for c in ctxs[1:_MAX_LINKS + 1]]
    with tracer("migsched").start_as_current_span(name, context=ctxs[0], links=links,
                                                  attributes={"migsched.messages": len(ctxs), **(attributes or {})}):
        yield


def inject(headers: MutableMapping[str, str], ctx: otel_context.Context | None = None) -> None:
    """Write ``traceparent`` (and ``tracestate``) for ``ctx`` (default: the current context) into headers."""
    if recording():
        propagate.inject(headers, context=ctx)
        return
    sc = trace.get_current_span(ctx).get_span_context()
    if not sc.is_valid:
        return
    headers["traceparent"] = f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"
    if sc.trace_state:
        headers["tracestate"] = sc.trace_state.to_header()


_EMPTY = otel_context.Context()


def extract(headers: Mapping[str, str] | None) -> otel_context.Context:
    if recording():
        return propagate.extract(headers or {})
    tp = headers.get("traceparent") if headers else None
    if not tp:
        return _EMPTY
    parts = tp.split("-")
    # W3C: version 00 has exactly four fields; a later version may append more. Anything odd is dropped, as
    # the API's propagator does.
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or (parts[0] == "00" and len(parts) != 4):
        return _EMPTY
    _, trace_id, span_id, flags = parts[:4]
    if len(trace_id) != 32 or len(span_id) != 16 or len(flags) != 2:
        return _EMPTY
    try:
        tid, sid, fl = int(trace_id, 16), int(span_id, 16), int(flags, 16)
    except ValueError:
        return _EMPTY
    if not tid or not sid:
        return _EMPTY
    state = headers.get("tracestate") if headers else None
    sc = SpanContext(
        tid,
        sid,
        is_remote=True,
        trace_flags=TraceFlags(fl),
        trace_state=TraceState.from_header([state]) if state else None,
    )
    return trace.set_span_in_context(NonRecordingSpan(sc), _EMPTY)
