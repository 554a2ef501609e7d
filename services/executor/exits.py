"""The executor's exit reports: every workload exit goes out on ``node.<node>.report`` as ``job_exit``, in
batches, never before its job's start report, retried through NATS outages with the same ids (the stream
drops a copy that had gone out). A stop of a copy that moved on (``migrate_stop``) is not an exit. The heartbeats
repeat each report for a few seconds after it went out (``told``): the node registry applies one its consumer
never delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from opentelemetry import trace

from services.common.recent import Recent
from services.executor.backend import Backend, WorkloadExit
from services.executor.instances import InstanceBook
from services.executor.runs import Runs
from shared import telemetry
from shared.bus import Outgoing
from shared.errors import MigschedError
from shared.events import ExitKind, JobExited, ToldExit, new_id, now
from shared.ports import EventBus

log = logging.getLogger("migsched.executor")
_tracer = telemetry.tracer("migsched.executor")
REMEMBERED_EXITS = 50000
"""Hard cap of ``ExitReports.recent`` (a safety net: the window bounds it, ~rate × window)."""
TOLD_AFTER_S = 1.0
"""A heartbeat repeats an exit report once it has been out this long: by then the registry has it, unless its
consumer skipped it, and repeating it sooner would only race the report."""
TOLD_FOR_S = 10.0
"""... and until it has been out this long: several heartbeats, in case one of them is lost too."""
TOLD_MAX = 64
"""At most this many exits in one heartbeat (the newest): the schema's bound."""
_TOLD_KEPT = 4096
"""Reports kept for the heartbeats: at a higher rate than ``_TOLD_KEPT / TOLD_AFTER_S`` a second only the newest
``TOLD_MAX`` would go out anyway."""
_EXIT_KIND: dict[str, ExitKind] = {
    "completed": "completed",
    "failed": "failed",
    "stopped": "cancelled",
    "lost": "lost",
}


class ExitReports:
    def __init__(self, bus: EventBus, backend: Backend, book: InstanceBook, node: str, runs: Runs, metrics: Any,
                 window_s: float, clock: Callable[[], float]) -> None:
        self.bus = bus
        self.subjects = bus.subjects
        self.backend = backend
        self.book = book
        self.node = node
        self.runs = runs
        self.metrics = metrics
        self.stopping = False
        # jobs whose exit report was published within the redelivery window (a move of a job that just ended
        # waits for its exit; one applied later than that finds nothing to wait for only after a 5 s wait, and
        # fails as it would have); an event only for a job someone waits on (one per exit held 8 MB at 20,000)
        self.recent: Recent[None] = Recent(window_s, REMEMBERED_EXITS, clock=clock)
        self._waiters: dict[str, asyncio.Event] = {}
        self._clock = clock
        self._told: deque[tuple[float, ToldExit]] = deque(maxlen=_TOLD_KEPT)  # (when published, report), oldest 1st

    async def run(self) -> None:
        """Report exits as they come, in batches: everything that ended while the last batch was being
        published goes out together (one JetStream round trip each awaited in turn caps a node near 1k/s)."""
        while True:
            exits = [await self.backend.next_exit()]
            # let the exits ending together join this batch: one short sleep, not a timed wait per exit (a
            # timer and a task each)
            await asyncio.sleep(0.0005)
            exits += self.backend.exits_ready(255)
            recording = telemetry.recording()
            subject = self.subjects.node_report(self.node)
            out: list[Outgoing] = []
            spans = []
            for ex in exits:
                started = self.runs.start_reported.pop(ex.job_id, None)
                if started is not None and not started.is_set():
                    # an exit must not overtake its job's start report (a very short job, or one stopped)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(started.wait(), timeout=5.0)
                if ex.job_id in self.runs.retired and ex.reason == "stopped":
                    self.runs.retired.discard(ex.job_id)  # its copy elsewhere carries on: not an exit
                    self.runs.forget(ex.job_id)
                    continue
                ctx, instance_id, gpu_index = self._run_of(ex)
                kind: ExitKind = _EXIT_KIND.get(ex.reason, "failed" if ex.status else "completed")
                if recording:
                    span = _tracer.start_span(
                        "executor job exit",
                        context=ctx,
                        attributes={"migsched.job_id": ex.job_id, "migsched.exit": kind, "migsched.status": ex.status},
                    )
                    spans.append(span)
                    ctx = trace.set_span_in_context(span, ctx)
                msg = JobExited(
                    id=new_id("exit"),
                    node=self.node,
                    at=now(),
                    job_id=ex.job_id,
                    status=ex.status,
                    instance_id=instance_id,
                    gpu_index=gpu_index,
                    exit=kind,
                    reason=(ex.reason + (": " + ex.output_tail if ex.output_tail else ""))[:2000],
                    started_by=ex.started_by or None,
                )
                out.append(Outgoing(subject, msg, ctx))
                self.metrics.exited(kind)
            await self._publish_reliably(out)
            for span in spans:
                span.end()
            for o in out:
                self.published(o.msg)  # type: ignore[arg-type]

    def _run_of(self, ex: WorkloadExit) -> tuple[Any, str | None, int | None]:
        """The trace context, instance and GPU index the exit ``ex`` reports; the latest run's tables are
        dropped unless the exit is an earlier run's."""
        if ex.instance is not None and (ex.job_id in self.backend.running() or self._earlier(ex)):
            # an earlier run's exit: the job runs again already (a redelivered or retried place started it after
            # this run ended), or its latest run here ended too (this exit was held back while its start report
            # was not out). The tables are the latest run's and stay for that run's own exit; this one names its
            # own instance, or the registry would take it for the latest run's and end that placement, which may
            # be the one that runs the job
            return self.runs.ctx.get(ex.job_id), self.book.name_of(ex.instance), ex.instance.gpu_index
        ctx = self.runs.ctx.pop(ex.job_id, None)
        self.runs.started.pop(ex.job_id, None)
        instance_id, gpu_index, _ = self.runs.instance.pop(ex.job_id, (None, None, None))
        if instance_id is None and ex.instance is not None:
            # the tables lost this run (another run's exit took them): the exit still names the instance it ran
            # on, or the registry would apply it to the job's run wherever it is
            instance_id, gpu_index = self.book.name_of(ex.instance), ex.instance.gpu_index
        return ctx, instance_id, gpu_index

    def published(self, report: JobExited) -> None:
        self.recent.put(report.job_id, None)
        self._told.append((self._clock(), ToldExit.of(report)))
        waiter = self._waiters.pop(report.job_id, None)
        if waiter is not None:
            waiter.set()

    def told(self) -> tuple[ToldExit, ...]:
        """The exit reports a heartbeat repeats now: out for ``TOLD_AFTER_S`` to ``TOLD_FOR_S``, the newest
        ``TOLD_MAX``, oldest first."""
        now_ = self._clock()
        while self._told and self._told[0][0] <= now_ - TOLD_FOR_S:
            self._told.popleft()
        due = [e for at, e in self._told if at <= now_ - TOLD_AFTER_S]
        return tuple(due[-TOLD_MAX:])

    async def reported(self, job_id: str, timeout: float) -> None:
        """Until this job's exit report is on the stream (or ``timeout``)."""
        if job_id in self.recent:
            return
        ev = self._waiters.setdefault(job_id, asyncio.Event())
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except TimeoutError:
            if self._waiters.get(job_id) is ev:
                del self._waiters[job_id]

    def _earlier(self, ex: WorkloadExit) -> bool:
        """Whether the run that ended is not the job's latest here: started by another command than the latest
        run (``Runs.started_by``), or, where either command is not known, on another GPU or GI."""
        latest_by = self.runs.started_by.get(ex.job_id)
        if latest_by and ex.started_by:
            return latest_by != ex.started_by
        latest, ran_on = self.runs.instance.get(ex.job_id), ex.instance
        return latest is not None and ran_on is not None and (latest[1], latest[2]) != (ran_on.gpu_index,
                                                                                         ran_on.gi_id)

    async def _publish_reliably(self, out: list[Outgoing]) -> None:
        """Job exits must reach the stream: retry through NATS outages (same ids: the stream dedupes)."""
        delay = 0.1
        while out:
            try:
                await self.bus.publish_batch(out)
                return
            except MigschedError as exc:
                if self.stopping:  # nats-py may turn our cancellation into a timeout: do not retry forever
                    log.warning("%d job exit(s) not published while stopping: %s", len(out), exc)
                    return
                log.warning("publishing %d job exit(s) failed, retrying: %s", len(out), exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

