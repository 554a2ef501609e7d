"""What the balancer knows of its queue without reading Redis, and when a backfill pass is wanted.

Exit and capacity signals coalesce into one pass per tick; the pass (a Redis read) is skipped while the queue is
known to be empty. The decoded specs of the jobs this replica queued are kept, so that a pass reads only the
queue's ids.
"""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry import trace

from shared import telemetry
from shared.events import JobSubmit

MAX_REMEMBERED = 100_000
_tracer = telemetry.tracer("migsched.balancer")


class Wait:
    """A job's stay in the queue as this replica saw it: since when, how often it was decided, the last reason
    it could not be placed."""

    __slots__ = ("decisions", "reason", "since")

    def __init__(self, since: float) -> None:
        self.since = since
        self.decisions = 0
        self.reason = ""


def trace_wait(ctx: Any, sub: JobSubmit, wait: Wait | None, end: float, outcome: str) -> None:
    """The wait in the queue as a span of the job's trace, from its queueing (its submit, when another replica
    queued it) to ``end``, with why it waited; ``outcome`` other than "placed" marks it an error."""
    if ctx is None or not telemetry.recording():
        return
    since = wait.since if wait is not None else sub.submitted_at
    span = _tracer.start_span("queue wait", context=ctx, start_time=int(since * 1e9), attributes={
        "migsched.job_id": sub.job_id,
        "migsched.wait_s": round(end - since, 6),
        "migsched.queue.decisions": wait.decisions if wait is not None else 0,
        "migsched.queue.reason": (wait.reason if wait is not None else "")[:1000],
        "migsched.queue.outcome": outcome,
    })
    if outcome != "placed":
        span.set_status(trace.Status(trace.StatusCode.ERROR, outcome[:200]))
    span.end(end_time=int(end * 1e9))


class Waiting:
    def __init__(self) -> None:
        self.specs: dict[str, tuple[JobSubmit, bytes, Any]] = {}
        self.waits: dict[str, Wait] = {}
        self.maybe_nonempty = True
        self.wanted = asyncio.Event()

    def request(self, queue_grew: bool = False) -> None:
        """Ask for a backfill pass on the next tick; ``queue_grew``: something may have been queued meanwhile."""
        self.wanted.set()
        if queue_grew:
            self.maybe_nonempty = True

    def queued(self, sub: JobSubmit, spec: bytes, ctx: Any, reason: str = "", now: float = 0.0) -> None:
        """``sub`` could not be placed (``reason``) and waits in the queue."""
        self.maybe_nonempty = True
        if len(self.specs) < MAX_REMEMBERED:
            self.specs[sub.job_id] = (sub, spec, ctx)
        wait = self.waits.get(sub.job_id)
        if wait is None and len(self.waits) < MAX_REMEMBERED:
            wait = self.waits[sub.job_id] = Wait(now or sub.submitted_at)
        if wait is not None:
            wait.decisions += 1
            wait.reason = reason

    def left(self, job_id: str) -> Wait | None:
        """``job_id`` left the queue (placed, rejected, cancelled): how it waited, when this replica saw it."""
        self.specs.pop(job_id, None)
        return self.waits.pop(job_id, None)

    def waits_on(self, job_id: str, wait: Wait) -> None:
        """``job_id``, which seemed to leave, waits on (its reservation lost a race): its wait goes on."""
        self.waits[job_id] = wait

    def take_request(self) -> bool:
        """True once per requested pass, unless the queue is known to be empty."""
        if self.wanted.is_set() and self.maybe_nonempty:
            self.wanted.clear()
            return True
        return False
