"""In-process helpers for integration tests and benchmarks: a scripted executor that speaks only NATS (as a real
one does) and records when each command arrived, a ``Stack`` that runs the scheduling services in one event loop
against the real NATS and Redis of a namespace, and ``until``, the tests' wait for a condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

import msgspec

from shared.bus import Consumer, Delivery, JetStreamBus, Outgoing
from shared.events import (
    CmdDone,
    CmdFailed,
    Command,
    GpuReport,
    Heartbeat,
    InstanceReport,
    JobExit,
    JobExited,
    Registered,
    RunStart,
    new_id,
)
from shared.settings import BalancerSettings, MigrationPlannerSettings, RegistrySettings, Settings, load

M = TypeVar("M", bound=msgspec.Struct)


async def until(pred: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0, every: float = 0.05) -> bool:
    """Whether ``pred`` (plain or async) holds within ``timeout`` seconds, asked every ``every`` seconds and once
    more at the end."""
    async def holds() -> bool:
        v = pred()
        return bool(await v) if isinstance(v, Awaitable) else bool(v)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await holds():
            return True
        await asyncio.sleep(every)
    return await holds()


class ScriptedExecutor:
    """Registers ``gpus`` GPUs of ``model`` for ``node``, confirms every command (or fails the placements of
    the jobs in ``fail_jobs``), and lets the test end jobs with ``exit()``. ``arrivals`` holds (receive time,
    command) for every command, in order. ``plain`` maps GPU indexes that are not in MIG mode to their
    time-slice replicas (0: whole-GPU jobs only)."""

    def __init__(
        self,
        bus: JetStreamBus,
        node: str,
        gpus: int = 2,
        model: str = "A100-40GB",
        auto_ack: bool = True,
        batch: int = 256,
        plain: Mapping[int, int] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.bus = bus
        self.labels = dict(labels or {})
        self.plain = dict(plain or {})
        self.node = node
        self.gpus = gpus
        self.model = model
        self.auto_ack = auto_ack
        self.fail_jobs: set[str] = set()
        self.fail_once: set[str] = set()
        """Jobs whose next placement fails, once: deterministic however fast the retry comes back."""
        self.lose_stop: set[str] = set()
        """Jobs whose next ``stop`` never arrives, as though the consumer had skipped it."""
        self.arrivals: list[tuple[float, Command]] = []
        self.running: dict[str, Command] = {}
        self.seq = 0
        self._consumer: Consumer = bus.command_consumer(node, self._on_commands, batch=batch)
        self._task: asyncio.Task[Any] | None = None
        self.got = asyncio.Event()

    async def start(self, instances: Iterable[tuple[int, str, int]] = ()) -> None:
        await self._consumer.start()
        self._task = asyncio.create_task(self._consumer.run())
        await self.register(instances)

    async def register(self, instances: Iterable[tuple[int, str, int]] = ()) -> None:
        """Publish ``registered``; ``instances`` are (gpu index, profile, start) found on the GPUs."""
        from shared.mig.geometry import default_geometry

        model = default_geometry().model(self.model)
        found: dict[int, list[InstanceReport]] = {}
        for n, (gi, prof, start) in enumerate(instances):
            p = model.profile(prof)
            found.setdefault(gi, []).append(
                InstanceReport(
                    gi_id=n + 1, profile=prof, profile_id=p.profile_id, start=start, size=p.memory_slices
                )
            )
        gpus = tuple(
            GpuReport(
                index=i,
                uuid=f"GPU-{self.node}-{i}",
                model=self.model,
                instances=tuple(found.get(i, ())),
                mig_enabled=i not in self.plain,
                replicas=self.plain.get(i, 0),
                jobs=tuple(j for j, c in self.running.items() if any(s.gpu_index == i for s in c.plain)),
            )
            for i in range(self.gpus)
        )
        await self.bus.publish(
            self.bus.subjects.node_report(self.node),
            Registered(id=new_id("reg"), node=self.node, at=time.time(), gpus=gpus, labels=self.labels,
                       addr=f"{self.node}.local"),
        )

    async def heartbeat(self) -> None:
        self.seq += 1
        await self.bus.publish(
            self.bus.subjects.node_heartbeat(self.node),
            Heartbeat(
                id=new_id("hb"), node=self.node, seq=self.seq, at=time.time(), running=tuple(self.running),
                started=tuple(RunStart(job_id=j, cmd_id=c.cmd_id) for j, c in self.running.items()),
            ),
        )

    async def _on_commands(self, ds: list[Delivery]) -> None:
        t = time.time()
        out: list[Outgoing] = []
        for d in ds:
            c: Command = d.data
            if c.kind == "stop" and c.job_id in self.lose_stop:
                self.lose_stop.discard(c.job_id)
                continue
            self.arrivals.append((t, c))
            if self.auto_ack:
                out.extend(self.reply(c))
        self.got.set()
        if out:
            await self.bus.publish_batch(out)

    def reply(self, c: Command) -> list[Outgoing]:
        subj = self.bus.subjects.node_report(self.node)
        now = time.time()
        failing_once = c.kind == "place" and c.job_id in self.fail_once
        self.fail_once.discard(c.job_id if failing_once else "")
        if failing_once or (c.kind in ("place", "migrate_start") and c.job_id in self.fail_jobs):
            return [
                Outgoing(
                    subj,
                    CmdFailed(
                        id=f"{c.cmd_id}.failed",
                        node=self.node,
                        at=now,
                        cmd_id=c.cmd_id,
                        command=c.kind,
                        job_id=c.job_id,
                        error="scripted failure",
                        code=3,
                    ),
                )
            ]
        if c.kind == "place" and c.job_id:
            for victim in c.stop_jobs:  # preempted: stopped first, no exit (as the executor does)
                self.running.pop(victim, None)
            self.running[c.job_id] = c
        if c.kind == "migrate_start" and c.job_id:
            self.running[c.job_id] = c
        out = [
            Outgoing(
                subj,
                CmdDone(
                    id=f"{c.cmd_id}.done",
                    node=self.node,
                    at=now,
                    cmd_id=c.cmd_id,
                    command=c.kind,
                    job_id=c.job_id,
                    instance=self._instance_report(c),
                ),
            )
        ]
        run = self.running.get(c.job_id or "")
        if c.kind == "stop" and c.job_id and not (run and c.src_cmd_id not in (None, run.cmd_id)):
            # as the executor: a stop naming the command of another run of the job is not this run's
            out.append(Outgoing(subj, self._exit(c.job_id, "cancelled", "stopped by command")))
        return out

    def _instance_report(self, c: Command) -> InstanceReport | None:
        """What the executor reports with a MIG ``place``'s ``cmd_done``: the instance the job runs on (read
        here from its id, ``<gpu>:<profile>@<start>:<nonce>``, as the node would find it)."""
        from shared.mig.geometry import default_geometry

        if c.kind != "place" or c.plain or not c.instance_id:
            return None
        profile, _, start = c.instance_id.split(":")[1].partition("@")
        model = default_geometry().model(self.model)
        if not model.has_profile(profile):
            return None
        p = model.profile(profile)
        return InstanceReport(
            instance_id=c.instance_id, profile=profile, profile_id=p.profile_id, start=int(start),
            size=p.memory_slices, job_id=c.job_id,
        )

    def _exit(self, job_id: str, kind: str, reason: str) -> JobExited:
        c = self.running.pop(job_id, None)
        return JobExited(
            id=new_id("exit"),
            node=self.node,
            at=time.time(),
            job_id=job_id,
            gpu_index=c.gpu_index if c else None,
            instance_id=c.instance_id if c else None,
            exit=kind,  # type: ignore[arg-type]
            reason=reason,
        )

    async def exit(self, job_ids: Iterable[str], kind: str = "completed") -> None:
        subj = self.bus.subjects.node_report(self.node)
        await self.bus.publish_batch([Outgoing(subj, self._exit(j, kind, "done")) for j in job_ids])

    async def wait_for(self, pred: Any, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            await asyncio.sleep(0.02)
        return bool(pred())

    def commands(self, kind: str | None = None) -> list[Command]:
        return [c for _, c in self.arrivals if kind is None or c.kind == kind]

    async def stop(self) -> None:
        self._consumer.stop()
        if self._task:
            await self._task


def _load(cls: Any, values: dict[str, Any]) -> Any:
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    return load(cls, **{k: v for k, v in values.items() if k in names})


class Stack:
    """Balancer + registry (+ migration planner) in this event loop, on one namespace."""

    def __init__(
        self, namespace: str, nats_url: str, redis_url: str, planner: bool = False, **common: Any
    ) -> None:
        base = {
            "namespace": namespace,
            "nats_url": nats_url,
            "redis_url": redis_url,
            "stream_storage": "memory",
            "metrics_port": 0,
            **common,
        }
        self.settings = _load(Settings, base)
        self._b = _load(BalancerSettings, base)
        self._p = _load(RegistrySettings, base)
        # the planner migrates (the seeds' planner) unless the test names a policy: its tests drive moves
        self._m = _load(MigrationPlannerSettings,
                        {"defrag_interval_s": 0.0, "cooldown_s": 0.0, "policy": "paper", **base})
        self.with_planner = planner
        self.services: list[Any] = []
        self.balancer: Any = None
        self.registry: Any = None
        self.planner: Any = None

    async def start(self) -> None:
        from services.balancer.service import Balancer
        from services.migration_planner.service import MigrationPlanner
        from services.registry.service import NodeRegistry

        self.balancer = await Balancer.create(self._b)
        self.registry = await NodeRegistry.create(self._p)
        self.services = [self.balancer, self.registry]
        if self.with_planner:
            self.planner = await MigrationPlanner.create(self._m)
            self.services.append(self.planner)
        for s in self.services:
            await s.start()

    async def stop(self) -> None:
        for s in reversed(self.services):
            await s.stop()


def make_settings(namespace: str, nats_url: str, redis_url: str, **kw: Any) -> Settings:
    return load(Settings, namespace=namespace, nats_url=nats_url, redis_url=redis_url,
                **{"stream_storage": "memory", "metrics_port": 0, **kw})


class Namespace:
    """A test's private bus and state: streams created at start; streams and keys removed at the end."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.bus: JetStreamBus = None  # type: ignore[assignment]
        self.state: Any = None

    async def __aenter__(self) -> Namespace:
        from shared.state import RedisState

        self.bus = await JetStreamBus.connect(self.settings, name="migsched-test")
        await self.bus.ensure_streams()
        self.state = RedisState.from_settings(self.settings)
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.bus.delete_streams()
            await self.state.wipe()
        finally:
            await self.bus.close()
            await self.state.close()

    async def watch(self, subject: str, kind: type[M]) -> Watch[M]:
        """Collect every message published on ``subject`` from now on, decoded as ``kind``, in order
        (``Watch.seen``)."""
        watch = Watch(kind)
        watch.sub = await self.bus.nc.subscribe(subject, cb=watch.on)
        return watch

    async def watch_exits(self) -> Watch[JobExit]:
        """``watch`` of ``jobs.exit``."""
        return await self.watch(self.bus.subjects.jobs_exit, JobExit)


class Watch(Generic[M]):
    def __init__(self, kind: type[M]) -> None:
        self.kind = kind
        self.seen: list[M] = []
        self.sub: Any = None

    async def on(self, msg: Any) -> None:
        self.seen.append(msgspec.json.decode(msg.data, type=self.kind))

    async def close(self) -> None:
        await self.sub.unsubscribe()


@contextlib.asynccontextmanager
async def private_state(prefix: str, nats_url: str, redis_url: str, **settings: Any) -> AsyncIterator[Any]:
    """The store the services use (``RedisState``), on keys of the namespace ``prefix`` only; wiped and closed
    afterwards. ``settings``: others than the defaults (e.g. ``shards``)."""
    from shared.state import RedisState

    state = RedisState.from_settings(make_settings(prefix, nats_url, redis_url, **settings))
    try:
        yield state
    finally:
        await state.wipe()
        await state.close()


@contextlib.asynccontextmanager
async def with_sim_executor(prefix: str, nats_url: str, redis_url: str, node: str, gpus: str = "A100-40GB:1",
                            planner: bool = False) -> AsyncIterator[Any]:
    """The scheduling services in this process (``Stack``) and one real executor of ``node`` on simulated
    ``gpus``, in the namespace ``prefix`` (its streams and keys removed afterwards); yields the ``Executor``."""
    from services.executor.service import Executor, ExecutorSettings, build_backend

    async with Namespace(make_settings(prefix, nats_url, redis_url)):
        services = Stack(prefix, nats_url, redis_url, planner=planner)
        await services.start()
        st = load(ExecutorSettings, env={}, nats_url=nats_url, redis_url=redis_url, namespace=prefix,
                  stream_storage="memory", node=node, executor_gpus=gpus, metrics_port=0,
                  executor_reconfig_latency_s=0.001, heartbeat_s=0.5)
        bus = await JetStreamBus.connect(st)
        executor = Executor(bus, build_backend(st, node), st, node)
        await executor.start()
        try:
            yield executor
        finally:
            await executor.stop()
            await executor.backend.close()
            await bus.close()
            await services.stop()
