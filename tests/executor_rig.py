"""An executor on a simulated two-GPU node, fed commands through an in-memory bus one fetched batch at a time,
with an injected clock: what the executor unit tests drive."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from services.executor.service import Executor, ExecutorSettings
from services.executor.sim_backend import SimBackend
from shared.bus import MemoryBus
from shared.events import Command, JobExited, decode, now
from shared.mig.geometry import default_geometry
from shared.policy.partition import MigOp
from shared.settings import load

NODE = "n1"
A100 = default_geometry().model("A100-40GB")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t




def place(cmd_id: str, job: str, gpu: int, profile: str, start: int) -> Command:
    p = A100.profile(profile)
    iid = f"{NODE}/{gpu}:{profile}@{start}:{job}"
    ops = tuple(MigOp(kind=k, gpu_id=f"{NODE}/{gpu}", instance_id=iid, profile=p.name, profile_id=p.profile_id,
                      start=start, size=p.memory_slices) for k in ("create_gi", "create_ci"))
    return Command(id=cmd_id, cmd_id=cmd_id, kind="place", node=NODE, gpu_id=f"{NODE}/{gpu}", gpu_index=gpu,
                   ops=ops, instance_id=iid, job_id=job, at=now(), submitted_at=now())


class Rig:
    def __init__(self) -> None:
        self.clock = Clock()
        self.settings = load(ExecutorSettings, env={}, node=NODE, ack_wait_s=30.0, max_deliver=5, metrics_port=0)
        self.bus = MemoryBus(self.settings)
        self.backend = SimBackend(node=NODE, models=["A100-40GB"] * 2, reconfig_latency_s=0.0)
        self.ex = Executor(self.bus, self.backend, self.settings, NODE, clock=self.clock)
        self.commands = self.ex.command_consumer()
        self.delivered = 0
        self.applied: list[str] = []
        real = self.ex.apply

        async def counting(cmd: Command, ctx: Any) -> list[Any]:
            self.applied.append(cmd.cmd_id)
            return await real(cmd, ctx)

        self.ex.apply = counting  # type: ignore[method-assign]

    async def deliver(self, cmd: Command) -> list[Any]:
        """Hand the command over as one fetched batch (a stream message of its own, as a redelivery is); the
        reports published for it."""
        await self.bus.ensure_streams()
        self.delivered += 1
        await self.bus.publish(self.bus.subjects.cmd(NODE), cmd, msg_id=f"{cmd.id}#{self.delivered}")
        before = len(self.bus.sent)
        assert await self.commands.poll() == 1
        return [decode(subject, data, self.bus.subjects) for subject, data, _ in self.bus.sent[before:]]

    @contextlib.asynccontextmanager
    async def reporting(self) -> AsyncIterator[None]:
        """The executor's exit reporter running; the backend closed afterwards."""
        task = asyncio.create_task(self.ex.exits.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self.backend.close()

    async def exits(self, count: int) -> list[JobExited]:
        """The exit reports published, once there are ``count`` of them (or as they are after 2 s)."""
        exits: list[JobExited] = []
        for _ in range(200):
            exits = [m for s, d, _ in self.bus.sent if isinstance(m := decode(s, d, self.bus.subjects), JobExited)]
            if len(exits) >= count:
                break
            await asyncio.sleep(0.01)
        return exits
