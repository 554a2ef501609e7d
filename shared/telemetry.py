"""OpenTelemetry set-up. Tracing lives in the bus adapters (``shared.bus``), never in policies.

``setup(service)`` installs a tracer provider once per process: OTLP/HTTP export (batch processor) when
``MIGSCHED_OTLP_ENDPOINT`` is set, otherwise a provider with no exporter (spans are cheap and context still
propagates). Tests pass their own ``SpanExporter`` (e.g. ``InMemorySpanExporter``) to see the spans.
W3C ``traceparent`` is the propagation format (the OpenTelemetry default).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

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
    global _installed
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


def shutdown() -> None:
    if _installed is not None:
        _installed.shutdown()


def tracer(name: str = "migsched") -> trace.Tracer:
    return trace.get_tracer(name)


def inject(headers: MutableMapping[str, str], ctx: otel_context.Context | None = None) -> None:
    """Write ``traceparent`` (and ``tracestate``) for ``ctx`` (default: the current context) into headers."""
    propagate.inject(headers, context=ctx)


def extract(headers: Mapping[str, str] | None) -> otel_context.Context:
    return propagate.extract(headers or {})
