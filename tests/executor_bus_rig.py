"""An executor on a simulated two-GPU node against a real NATS (JetStream), fed commands over the bus, with a
plain NATS subscription watching its ``node.<node>.*`` subjects (JetStream publishes reach core subscribers too):
what the executor's integration tests drive."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from services.executor.service import Executor, ExecutorSettings, build_backend
from shared.bus import JetStreamBus
from shared.events import CmdDone, CmdFailed, Command, Subjects, decode, now
from shared.mig.geometry import default_geometry
from shared.policy.partition import MigOp
from shared.settings import load

NODE = "n1"
A100 = default_geometry().model("A100-40GB")


class Watch:
    """Every decoded message on ``node.<node>.>`` in arrival order, with a wait-for helper."""

    def __init__(self, subjects: Subjects) -> None:
        self.subjects = subjects
        self.seen: list[Any] = []
        self._new = asyncio.Condition()

    async def on_msg(self, m: Any) -> None:
        self.seen.append(decode(m.subject, m.data, self.subjects))
        async with self._new:
            self._new.notify_all()

    async def until(self, pred: Any, timeout: float = 10.0) -> Any:
        async def wait() -> Any:
            async with self._new:
                while True:
                    for msg in self.seen:
                        if pred(msg):
                            return msg
                    await self._new.wait()

        return await asyncio.wait_for(wait(), timeout)

    def of(self, kind: type) -> list[Any]:
        return [m for m in self.seen if isinstance(m, kind)]


class Rig:
    def __init__(self, bus: JetStreamBus, executor: Executor, watch: Watch) -> None:
        self.bus, self.executor, self.watch = bus, executor, watch
        self.subjects = bus.subjects

    async def send(self, cmd: Command, msg_id: str | None = None) -> None:
        await self.bus.publish(self.subjects.cmd(NODE), cmd, msg_id=msg_id)

    async def handled(self, n: int, timeout: float = 10.0) -> None:
        """Wait until this executor's command consumer has settled ``n`` messages."""

        async def wait() -> None:
            while self.executor._consumer.handled < n:
                await asyncio.sleep(0.02)

        await asyncio.wait_for(wait(), timeout)

    async def restart(self) -> None:
        """A new executor process on the same (simulated) GPUs: it remembers no command."""
        await self.executor.stop()
        self.executor = Executor(self.bus, self.executor.backend, self.executor.settings, NODE)
        await self.executor.start()


@contextlib.asynccontextmanager
async def started(nats_url: str, prefix: str) -> AsyncIterator[Rig]:
    """One executor on a simulated two-GPU node, its bus and a watch on its node subjects."""
    settings = load(
        ExecutorSettings,
        env={},
        nats_url=nats_url,
        namespace=prefix,
        stream_storage="memory",
        node=NODE,
        executor_gpus="A100-40GB:2",
        executor_reconfig_latency_s=0.01,
        heartbeat_s=0.2,
        metrics_port=0,
        fetch_timeout_s=0.05,
    )
    bus = await JetStreamBus.connect(settings)
    watch = Watch(bus.subjects)
    sub = await bus.nc.subscribe(f"{bus.subjects.root}node.{NODE}.>", cb=watch.on_msg)
    executor = Executor(bus, build_backend(settings, NODE), settings, NODE)
    await executor.start()
    r = Rig(bus, executor, watch)
    try:
        yield r
    finally:
        await r.executor.stop()
        await r.executor.backend.close()
        await sub.unsubscribe()
        await bus.delete_streams()
        await bus.close()


def create_ops(gpu: int, profile: str, start: int, iid: str) -> tuple[MigOp, ...]:
    return _ops(("create_gi", "create_ci"), gpu, profile, start, iid)


def destroy_ops(gpu: int, profile: str, start: int, iid: str) -> tuple[MigOp, ...]:
    return _ops(("destroy_ci", "destroy_gi"), gpu, profile, start, iid)


def _ops(kinds: tuple[str, str], gpu: int, profile: str, start: int, iid: str) -> tuple[MigOp, ...]:
    p = A100.profile(profile)
    return tuple(MigOp(kind=k, gpu_id=f"{NODE}/{gpu}", instance_id=iid, profile=p.name, profile_id=p.profile_id,
                       start=start, size=p.memory_slices) for k in kinds)


def place(
    cmd_id: str, job: str, gpu: int, profile: str, start: int, duration: float | None = None
) -> Command:
    iid = f"{NODE}/{gpu}:{profile}@{start}:{job}"
    return Command(
        id=cmd_id,
        cmd_id=cmd_id,
        kind="place",
        node=NODE,
        gpu_id=f"{NODE}/{gpu}",
        gpu_index=gpu,
        ops=create_ops(gpu, profile, start, iid),
        instance_id=iid,
        job_id=job,
        duration_s=duration,
        at=now(),
        submitted_at=now(),
    )


def move_start(cmd_id: str, job: str, gpu: int, dst: str, src: str, ops: tuple[MigOp, ...]) -> Command:
    """The command that starts ``job``'s move into ``dst`` on ``gpu`` (``ops`` make its way), ``src`` still
    running."""
    return Command(id=cmd_id, cmd_id=cmd_id, kind="migrate_start", node=NODE, gpu_id=f"{NODE}/{gpu}",
                   gpu_index=gpu, ops=ops, instance_id=dst, src_instance_id=src, job_id=job, at=now())


def is_done(cmd_id: str) -> Any:
    return lambda m: isinstance(m, CmdDone | CmdFailed) and m.cmd_id == cmd_id

