"""The executor: one per GPU node. A thin adapter between its ``cmd.<node>`` consumer and a GPU backend.

On start it discovers its GPUs, reconciles (adopts the instances and workloads it finds, reports drift) and
registers; then it heartbeats, applies commands and reports their results and every job exit on its own
``node.<node>.*`` subjects (it never touches Redis: the node registry turns reports into state).

Commands of one GPU are applied one after the other in stream order (MIG operations on one GPU serialise in
the driver anyway); different GPUs proceed in parallel. Each command is idempotent: ops already done are
skipped (``instances.InstanceBook``), a workload already running where asked is left alone, and a command
seen before by this process, within the time a redelivery comes (two ``ack_wait_s``, ``redelivery_window_s``), is
answered with the reports it produced the first time (same message ids, so the stream's duplicate window drops
them if they had already gone out). One seen longer ago is applied again like any other, which finds its work
done (see above); its reports carry the same ids (``<cmd_id>.done`` / ``.failed``). Stops are the exception:
a replay could end a run placed since, so they run once (``commands``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from services.common import health
from services.common.recent import Recent
from services.executor import nvml_codes
from services.executor.backend import Backend, BackendError, BusyInstanceError
from services.executor.commands import Commands, lane_of
from services.executor.config import ExecutorError, ExecutorSettings, build_backend, hosted_nodes, parse_gpus
from services.executor.exits import ExitReports
from services.executor.instances import InstanceBook
from services.executor.metrics import ExecutorMetrics
from services.executor.registration import Registration
from services.executor.runs import Runs
from shared import telemetry
from shared.bus import Delivery, JetStreamBus, Outgoing
from shared.errors import MigschedError
from shared.events import (
    CmdDone,
    CmdFailed,
    Command,
    Heartbeat,
    RunningSlot,
    RunStart,
    decode,
    encode,
    now,
)
from shared.ports import EventBus
from shared.settings import load

__all__ = ["Executor", "ExecutorError", "ExecutorSettings", "build_backend", "main", "parse_gpus", "serve"]

log = logging.getLogger("migsched.executor")
_tracer = telemetry.tracer("migsched.executor")
_REMEMBERED_COMMANDS = 50000
"""Hard cap of the commands remembered for redeliveries (a safety net: the window bounds them, ~rate × window)."""


class Executor:
    """decode (the bus) -> lanes per GPU -> apply (``Commands``) -> publish the reports -> ack; beside it
    ``ExitReports`` reports every workload exit, ``Registration`` registers the node, and heartbeats go out."""

    def __init__(
        self,
        bus: EventBus,
        backend: Backend,
        settings: ExecutorSettings,
        node: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: what ages the remembered commands and exits (tests inject one)."""
        self.bus, self.backend, self.settings, self.node = bus, backend, settings, node
        self.subjects = bus.subjects
        self.book = InstanceBook(backend, {})
        self.metrics = ExecutorMetrics(node)
        self._gpu_locks: dict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        # command id -> its reports as sent (compressed JSON, one bytes per report: ~0.4 KB a command with its
        # key instead of ~1.3 KB of structs, contexts and wrappers): a redelivered command is answered with them
        # again, for as long as ``redelivery_window_s`` says one comes.
        self._done: Recent[bytes | tuple[bytes, ...]] = Recent(
            self.redelivery_window_s(settings), _REMEMBERED_COMMANDS, clock=clock
        )
        self._drift_seen = False
        self.runs = Runs()
        self.registration = Registration(bus, backend, self.book, node, settings, self.runs.started_by)
        self.exits = ExitReports(bus, backend, self.book, node, self.runs, self.metrics,
                                 self.redelivery_window_s(settings), clock)
        self.commands = Commands(backend, self.book, node, settings, self.metrics, self.runs, self.exits,
                                 self.registration, self._gpu_locks, clock)
        self._tasks: list[asyncio.Task[None]] = []
        self._consumer: Any = None
        self._seq = 0
        self.stopped = asyncio.Event()
        # benchmarks only; closed with the process
        self._latency_log = (
            open(settings.executor_latency_log, "a") if settings.executor_latency_log else None  # noqa: SIM115
        )

    # --- lifecycle ------------------------------------------------------------------------------------------
    def command_consumer(self) -> Any:
        """This node's consumer of ``cmd.<node>``; a command waits up to ``off_path_linger_s`` for the rest of
        its burst (it is past the submit -> command latency the stack is held to)."""
        return self.bus.command_consumer(self.node, self.handle, linger_s=self.settings.off_path_linger_s)

    async def register(self) -> None:
        await self.registration.register()

    async def apply(self, cmd: Command, ctx: otel_context.Context) -> list[Any]:
        """Carry out one command; the reports to publish (raises MigschedError when it cannot be done)."""
        return await self.commands.apply(cmd, ctx)

    async def start(self) -> None:
        await self.bus.ensure_streams()
        await self.register()
        self._consumer = self.command_consumer()
        await self._consumer.start()
        self._tasks = [
            asyncio.create_task(self._consumer.run()),
            asyncio.create_task(self._heartbeats()),
            asyncio.create_task(self.exits.run()),
        ]
        log.info(
            "executor %s up: %d GPUs on the %s backend", self.node, len(self.book.models), self.backend.name
        )

    def readiness(self) -> str | None:
        """Why this node's executor is not ready (``/readyz``), or None."""
        consumers = [self._consumer] if self._consumer is not None else []
        return health.consumers_readiness(bool(consumers), consumers, self._tasks, self.exits.stopping)

    async def stop(self) -> None:
        self.exits.stopping = True
        if self._consumer is not None and self._tasks:
            # let the fetch loop finish its current fetch rather than cancelling it: a fetch cancelled midway
            # leaves its subscription with an unconsumed message, and the connection's drain then never ends
            self._consumer.stop()
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(self._tasks[0]), 2.0)
            sub = getattr(self._consumer, "_sub", None)
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.stop()
        for t in self._tasks:
            t.cancel()
        if self._tasks:  # bounded: a task that does not honour its cancellation must not hang the shutdown
            await asyncio.wait(self._tasks, timeout=2.0)
        self.stopped.set()

    # --- commands -------------------------------------------------------------------------------------------
    async def handle(self, deliveries: list[Delivery]) -> None:
        """Apply a fetched batch (per GPU in stream order, GPUs in parallel), then publish its reports."""
        lanes: dict[int, list[Delivery]] = defaultdict(list)
        for d in deliveries:
            lanes[lane_of(d.data, self.backend)].append(d)
        if self._latency_log is not None:
            t = time.time()
            self._latency_log.write(
                "".join(
                    f"{d.data.job_id} {d.data.submitted_at:.6f} {t:.6f}\n"
                    for d in deliveries
                    if d.data.kind == "place"
                )
            )
            self._latency_log.flush()
        results = await asyncio.gather(*(self._run_lane(ds) for ds in lanes.values()))
        out = [o for lane in results for o in lane]
        await self.bus.publish_batch(out)
        if self._drift_seen:
            # A create refused for overlap means this node holds an instance the state does not know (left by
            # a command that ran after its job was re-queued elsewhere); a start refused because the instance
            # runs another job, that the state took a busy instance for idle. Re-registering after the failure
            # reports (same subject, so the registry applies them first) lets the state adopt it as idle or
            # stop its job, instead of the balancer choosing the same slot again until the job fails. Once per
            # batch that saw it, never throttled in time: the balancer retries within a round trip, so a
            # registration held back even a second lets one job's retries run out (``max_attempts``) on the
            # same slot; each registration ends the drift it reports, so the registrations stop with it.
            self._drift_seen = False
            await self.register()
        for o in out:
            r = o.msg
            reported = self.runs.start_reported
            if isinstance(r, CmdDone | CmdFailed) and r.command == "place" and r.job_id in reported:
                reported[r.job_id].set()

    async def _run_lane(self, deliveries: list[Delivery]) -> list[Outgoing]:
        out: list[Outgoing] = []
        subject = self.subjects.node_report(self.node)
        # Without an SDK tracer provider nothing records: no span per command (as in the bus's consumer), the
        # sender's context carries the trace on to the reports.
        recording = telemetry.recording()
        for d in deliveries:
            cmd: Command = d.data
            self.metrics.received(cmd)
            replay = self._done.get(cmd.cmd_id)
            if replay is not None:
                out += self._replayed(subject, replay, d.ctx)
                continue
            async with self._gpu_locks[lane_of(cmd, self.backend)]:
                if recording:
                    with _tracer.start_as_current_span(
                        f"executor {cmd.kind}",
                        context=d.ctx,
                        attributes={
                            "migsched.node": self.node,
                            "migsched.cmd_id": cmd.cmd_id,
                            "migsched.job_id": cmd.job_id or "",
                            "migsched.ops": len(cmd.ops),
                        },
                    ) as span:
                        ctx = trace.set_span_in_context(span, d.ctx)
                        msgs = await self._apply_one(d, cmd, ctx, span)
                else:
                    ctx = d.ctx
                    msgs = await self._apply_one(d, cmd, ctx, None)
            if msgs is None:
                continue
            outgoing = [Outgoing(subject, m, ctx) for m in msgs]
            self._remember(cmd.cmd_id, outgoing)
            out += outgoing
        return out

    async def _apply_one(
        self, d: Delivery, cmd: Command, ctx: otel_context.Context, span: trace.Span | None
    ) -> list[Any] | None:
        """The command's reports, a ``CmdFailed`` when it cannot be done, None when it is to be redelivered."""
        t0 = time.perf_counter()
        try:
            msgs = await self.apply(cmd, ctx)
        except MigschedError as exc:
            code = exc.code if isinstance(exc, BackendError) else None
            drift = code == nvml_codes.INSUFFICIENT_RESOURCES or isinstance(exc, BusyInstanceError)
            if drift and cmd.kind in ("place", "migrate_start"):
                self._drift_seen = True
            if span is not None:
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)[:200]))
            log.warning("command %s (%s) failed: %s", cmd.cmd_id, cmd.kind, exc)
            msgs = [
                CmdFailed(
                    id=f"{cmd.cmd_id}.failed",
                    node=self.node,
                    at=now(),
                    cmd_id=cmd.cmd_id,
                    command=cmd.kind,
                    job_id=cmd.job_id,
                    error=str(exc)[:2000],
                    code=code,
                )
            ]
        except Exception as exc:  # a fault of ours or the bus: redeliver (bounded, then dead-letter)
            log.exception("command %s (%s) raised", cmd.cmd_id, cmd.kind)
            d.retry(f"executor error: {exc!r}"[:500])
            return None
        self.metrics.applied(cmd, msgs, time.perf_counter() - t0)
        return msgs

    @staticmethod
    def redelivery_window_s(settings: ExecutorSettings) -> float:
        """How long a handled command is answered from memory: two acknowledgement waits. This process acks a
        command as soon as it is handled, so it comes again only when that ack is lost (a connection blip),
        after one ``ack_wait_s``; the second wait covers the handling and a slow server. A command whose ack
        is lost twice (``max_deliver`` allows more) is applied again like after a restart of the executor:
        its ops find their work done and its reports keep their ids; a run the state did not expect is
        stopped by the registry (docs/architecture.md, data flow step 6). Keeping the full
        ``ack_wait_s × max_deliver`` (150 s) held ~20,000 commands per executor at 125 commands/s and kept RSS
        growing for minutes."""
        return 2.0 * settings.ack_wait_s

    def _remember(self, cmd_id: str, outgoing: list[Outgoing]) -> None:
        # Compressed (the ids in a report are random hex, the rest repeats): what a replay needs is the message,
        # its subject is this node's report subject and its trace context that of the redelivery (same trace).
        # Kept compressed although zlib costs ~13 us a message (its stream set-up): as exact-size JSON an entry
        # takes 567 bytes instead of 381 and the window holds rate x 60 s of them, so the executors' memory
        # follows the command rate more (1,700 commands/s catching up: ~19 MB more); a soak whose stack fell
        # behind ended with the executors at +15 % RSS that way (+4.1 % with zlib in the last soak that kept up).
        packed = tuple(zlib.compress(encode(o.msg), 1) for o in outgoing)
        self._done.put(cmd_id, packed[0] if len(packed) == 1 else packed)

    def _replayed(self, subject: str, packed: bytes | tuple[bytes, ...], ctx: otel_context.Context) -> list[Outgoing]:
        """The reports of a command remembered by ``_remember``, as they were first sent."""
        items = (packed,) if isinstance(packed, bytes) else packed
        return [Outgoing(subject, decode(subject, zlib.decompress(b), self.subjects), ctx) for b in items]

    async def _heartbeats(self) -> None:
        while True:
            self._seq += 1
            on = dict(self.backend.running())  # a copy: the live view changes as runs start and end
            running = tuple(sorted(on))[:4096]
            # only what the schema bounds: a heartbeat its readers cannot decode would count as silence
            slots = tuple(RunningSlot(job_id=j, gpu_index=i.gpu_index, profile=i.profile, start=i.start)
                          for j, i in sorted(on.items())
                          if not i.gpus and i.profile and 0 <= i.start <= 7 and 0 <= i.gpu_index <= 1023)[:4096]
            by = self.runs.started_by
            started = tuple(RunStart(job_id=j, cmd_id=by[j]) for j in running if by.get(j))
            self.metrics.running(len(running))
            try:
                await self.bus.publish(
                    self.subjects.node_heartbeat(self.node),
                    Heartbeat(
                        id=f"hb-{self.node}-{int(time.time() * 1000)}-{self._seq}",
                        node=self.node,
                        seq=self._seq,
                        at=now(),
                        running=running,
                        slots=slots,
                        started=started,
                        exits=self.exits.told(),
                    ),
                )
            except MigschedError as exc:
                log.warning("heartbeat %d not published: %s", self._seq, exc)
            await asyncio.sleep(self.settings.heartbeat_s)


async def serve(settings: ExecutorSettings | None = None, *, stop: asyncio.Event | None = None) -> None:
    """Run this process's executor(s) until ``stop`` is set (or SIGTERM/SIGINT when run as a process): one
    node, or the simulated ``nodes`` side by side (``hosted_nodes``)."""
    settings = settings or load(ExecutorSettings)
    nodes = hosted_nodes(settings)
    telemetry.setup(
        f"migsched-executor-{nodes[0]}" if len(nodes) == 1 else "migsched-executors",
        endpoint=settings.otlp_endpoint or None,
        sample_ratio=settings.trace_sample_ratio,
    )
    probes = health.Probes()
    if settings.metrics_port:  # the probes and this process's metrics
        health.serve(settings.metrics_port, probes)
    ticking = asyncio.create_task(probes.keep_ticking())
    started: list[Executor] = []

    def readiness() -> str | None:
        if len(started) < len(nodes):
            return f"{len(started)} of {len(nodes)} node(s) started"
        return next((f"{e.node}: {why}" for e in started if (why := e.readiness()) is not None), None)

    probes.readiness = readiness
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    # Simulated nodes side by side share one connection: a message for any of them, and a publish of any of
    # them, then rides with the others' in one socket read or write of this process and of the server, where
    # a connection per node cost a wake-up per message on both sides. Each node keeps its own consumer,
    # subjects, heartbeats and GPUs.
    shared = await JetStreamBus.connect(settings, name="executors") if len(nodes) > 1 else None
    try:
        # a node that fails cancels the others (each closes what it opened): the process exits as one would
        async with asyncio.TaskGroup() as tg:
            for node in nodes:
                tg.create_task(_serve_node(settings, node, stop, shared, started), name=f"executor-{node}")
    finally:
        ticking.cancel()
        if shared is not None:
            await shared.close()
        telemetry.shutdown()


async def _serve_node(settings: ExecutorSettings, node: str, stop: asyncio.Event, shared: EventBus | None,
                      started: list[Executor]) -> None:
    backend = build_backend(settings, node)
    bus = shared or await JetStreamBus.connect(settings, name=f"executor-{node}")
    executor = Executor(bus, backend, settings, node)
    try:
        await executor.start()
        started.append(executor)
        await stop.wait()
    finally:
        await executor.stop()
        await backend.close()
        if shared is None:
            await bus.close()
        log.info("executor %s stopped", node)


def main(**overrides: Any) -> None:
    """``python -m services.executor`` / ``migsched service executor``; ``overrides`` win over MIGSCHED_*."""
    settings = load(ExecutorSettings, **overrides)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    from services.common.runner import run_profiled

    run_profiled("executor", lambda: serve(settings))
