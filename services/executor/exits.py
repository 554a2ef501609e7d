"""The executor's exit reports: every workload exit goes out on ``node.<node>.report`` as ``job_exit``, in
batches, never before its job's start report, retried through NATS outages with the same ids (the stream
drops a copy that had gone out). A stop of a copy that moved on (``migrate_stop``) is not an exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace

from services.executor.backend import Backend
from services.executor.instances import InstanceBook
from shared import telemetry
from shared.bus import Bus, Outgoing
from shared.errors import MigschedError
from shared.events import ExitKind, JobExited, new_id, now

log = logging.getLogger("migsched.executor")
_tracer = telemetry.tracer("migsched.executor")
_REMEMBERED_EXITS = 50000
"""Hard cap of ``_exits_out`` (a safety net: the window bounds it, ~rate × window)."""
V = TypeVar("V")
_EXIT_KIND: dict[str, ExitKind] = {
    "completed": "completed",
    "failed": "failed",
    "stopped": "cancelled",
    "lost": "lost",
}


class Recent(Generic[V]):
    """A map that keeps each entry for at least ``window_s`` (by ``clock``) and forgets it within
    ``window_s × generations / (generations − 1)``; at most ``cap`` entries (older ones go first).

    Entries live in generations (plain dicts, newest first) that rotate every ``window_s / (generations − 1)``
    (and early when the newest holds ``cap / generations``): no timestamp per entry, no per-entry eviction, so
    an entry costs its key, its value and a dict slot; the size settles at rate × window within one window,
    whatever the rate. Rotation is lazy (on access), so an idle map keeps its memory until touched again.
    """

    __slots__ = ("_clock", "_generations", "_gens", "_per_gen", "_started", "_step", "cap", "window_s")

    def __init__(self, window_s: float, cap: int, *, clock: Callable[[], float] = time.monotonic,
                 generations: int = 6) -> None:
        if window_s <= 0 or cap < 1 or generations < 2:
            raise ValueError("Recent needs window_s > 0, cap >= 1 and generations >= 2")
        self.window_s, self.cap, self._clock = window_s, cap, clock
        self._generations = generations
        self._step = window_s / (generations - 1)
        self._per_gen = max(1, cap // generations)
        self._gens: deque[dict[str, V]] = deque([{}])
        self._started = clock()  # when the newest generation began

    def _age(self) -> None:
        now = self._clock()
        steps = int((now - self._started) // self._step)
        if steps <= 0:
            return
        if steps >= self._generations:  # everything is older than the window
            self._gens = deque([{}])
        else:
            for _ in range(steps):
                self._rotate()
        self._started += steps * self._step

    def _rotate(self) -> None:
        self._gens.appendleft({})
        while len(self._gens) > self._generations:
            self._gens.pop()

    def get(self, key: str) -> V | None:
        self._age()
        for g in self._gens:
            got = g.get(key)
            if got is not None or key in g:
                return got
        return None

    def __contains__(self, key: str) -> bool:
        self._age()
        return any(key in g for g in self._gens)

    def put(self, key: str, value: V) -> None:
        self._age()
        newest = self._gens[0]
        if len(newest) >= self._per_gen:  # the cap: rotate early (the oldest generation goes sooner)
            self._rotate()
            self._started = self._clock()
            newest = self._gens[0]
        newest[key] = value

    def __len__(self) -> int:
        """Entries held (a key put again in a later generation counts twice until the older one goes)."""
        self._age()
        return sum(len(g) for g in self._gens)


class ExitsMixin:
    """Mixed into ``Executor``, which sets these attributes."""

    bus: Bus
    backend: Backend
    book: InstanceBook
    node: str
    subjects: Any
    metrics: Any
    _stopping: bool
    _job_ctx: dict[str, otel_context.Context]
    _job_started: dict[str, tuple[float, float | None]]
    _start_reported: dict[str, asyncio.Event]
    _job_instance: dict[str, tuple[str, int]]
    _retired: set[str]
    _exits_out: Recent[None]
    _exit_waiters: dict[str, asyncio.Event]

    async def _exits(self) -> None:
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
                started = self._start_reported.pop(ex.job_id, None)
                if started is not None and not started.is_set():
                    # an exit must not overtake its job's start report (a very short job, or one stopped)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(started.wait(), timeout=5.0)
                if ex.job_id in self._retired and ex.reason == "stopped":
                    self._retired.discard(ex.job_id)  # its copy elsewhere carries on: not an exit
                    for table in (self._job_ctx, self._job_started, self._job_instance):
                        table.pop(ex.job_id, None)
                    continue
                instance_id: str | None
                gpu_index: int | None
                if ex.instance is not None and ex.job_id in self.backend.running():
                    # the job runs again already (a redelivered or retried place started it after this run
                    # ended): the tables are the new run's, and this exit must name its own instance, or the
                    # registry would take it for the new run's exit and finish the job while it runs
                    ctx = self._job_ctx.get(ex.job_id)
                    instance_id, gpu_index = self.book.name_of(ex.instance), ex.instance.gpu_index
                else:
                    ctx = self._job_ctx.pop(ex.job_id, None)
                    self._job_started.pop(ex.job_id, None)
                    instance_id, gpu_index = self._job_instance.pop(ex.job_id, (None, None))
                kind: ExitKind = _EXIT_KIND.get(ex.reason, "failed" if ex.status else "completed")
                if recording:
                    span = _tracer.start_span(
                        "executor job exit",
                        context=ctx,
                        attributes={
                            "migsched.job_id": ex.job_id,
                            "migsched.exit": kind,
                            "migsched.status": ex.status,
                        },
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
                )
                out.append(Outgoing(subject, msg, ctx))
                self.metrics.exited(kind)
            await self._publish_reliably(out)
            for span in spans:
                span.end()
            for o in out:
                self._exit_published(o.msg.job_id)  # type: ignore[attr-defined]

    def _exit_published(self, job_id: str) -> None:
        self._exits_out.put(job_id, None)
        waiter = self._exit_waiters.pop(job_id, None)
        if waiter is not None:
            waiter.set()

    async def _exit_reported(self, job_id: str, timeout: float) -> None:
        """Until this job's exit report is on the stream (or ``timeout``)."""
        if job_id in self._exits_out:
            return
        ev = self._exit_waiters.setdefault(job_id, asyncio.Event())
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except TimeoutError:
            if self._exit_waiters.get(job_id) is ev:
                del self._exit_waiters[job_id]

    async def _publish_reliably(self, out: list[Outgoing]) -> None:
        """Job exits must reach the stream: retry through NATS outages (same ids: the stream dedupes)."""
        delay = 0.1
        while out:
            try:
                await self.bus.publish_batch(out)
                return
            except MigschedError as exc:
                if self._stopping:  # nats-py may turn our cancellation into a timeout: do not retry forever
                    log.warning("%d job exit(s) not published while stopping: %s", len(out), exc)
                    return
                log.warning("publishing %d job exit(s) failed, retrying: %s", len(out), exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
