"""``Candidate``: one job the balancer decides now, fresh from ``jobs.submit`` or taken from its queue."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import context as otel_context

from shared import telemetry
from shared.bus import Delivery
from shared.events import JobSubmit


@dataclass
class Candidate:
    """One job to decide now: fresh from ``jobs.submit`` or taken from the pending queue."""

    submit: JobSubmit
    spec: bytes
    ctx: otel_context.Context | None
    delivery: Delivery | None = None
    from_queue: bool = False
    attempt: int = 0
    prio: int | None = None
    """The priority resolved from the tenancy's classes (None: the submit's own ``priority``)."""
    routed: bool = False
    """Its shard was chosen (``routing``): a new job is routed at most once."""

    @property
    def priority(self) -> int:
        return self.submit.priority if self.prio is None else self.prio

    @property
    def traceparent(self) -> str:
        """The W3C traceparent of ``ctx``, stored with a queued job: its later placement continues it."""
        if self.ctx is None:
            return ""
        carrier: dict[str, str] = {}
        telemetry.inject(carrier, self.ctx)
        return carrier.get("traceparent", "")
