"""The base of the scheduling services: connections, consumers, periodic tasks and a graceful stop.

A service subclass lists its consumers in ``consumers()`` and its periodic jobs in ``periodic()``; ``start()``
creates the streams (idempotent), loads what the service needs and starts one task per consumer and per
periodic
job; ``stop()`` asks the consumers to finish their current batch (messages are acked or come back), cancels
the
periodic jobs and closes the connections.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from services.common import health
from shared.bus import Consumer, JetStreamBus
from shared.mig.geometry import Geometry, default_geometry, load_geometry
from shared.ports import EventBus, StateStore
from shared.settings import Settings
from shared.state import RedisState
from shared.state.outage import is_outage

Periodic = tuple[str, float, Callable[[], Awaitable[None]]]


@dataclass(frozen=True, slots=True)
class Context:
    """What the named parts of a service share: its settings, its two ports, the geometry and its logger."""

    settings: Any
    bus: EventBus
    state: StateStore
    geometry: Geometry
    log: logging.Logger


class Service:
    name = "service"

    def __init__(
        self, settings: Settings, bus: EventBus, state: StateStore, geometry: Geometry | None = None
    ) -> None:
        self.settings = settings
        self.bus = bus
        self.state = state
        self.subjects = bus.subjects
        self.geometry = geometry or (
            load_geometry(settings.geometry_file) if settings.geometry_file else default_geometry()
        )
        self.log = logging.getLogger(f"migsched.{self.name}")
        self._consumers: list[Consumer] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._stopping = asyncio.Event()
        self._started = False

    def context(self) -> Context:
        return Context(self.settings, self.bus, self.state, self.geometry, self.log)

    @classmethod
    async def create(cls, settings: Settings, geometry: Geometry | None = None) -> Any:
        bus = await JetStreamBus.connect(settings, name=f"migsched-{cls.name}")
        state = RedisState.from_settings(settings)
        return cls(settings, bus, state, geometry)

    def consumers(self) -> list[Consumer]:
        return []

    def periodic(self) -> list[Periodic]:
        return []

    async def prepare(self) -> None:
        """Load what the service needs before it consumes (e.g. the balancer's mirror)."""

    async def retire_consumer(self, stream: str, durable: str) -> None:
        """Delete a durable an older version of this service left (``Consume.retired`` grants exactly that).
        Never fatal: a server that refuses (a config rendered before the grant) costs a warning, and the old
        consumer only keeps what nobody reads until its stream's age limit drops it."""
        try:
            await self.bus.delete_consumer(stream, durable)
        except Exception as exc:  # no answer (permissions), or the connection is busy reconnecting
            self.log.warning("could not delete the retired consumer %s on %s (%r); an operator may: "
                             "nats consumer rm %s %s", durable, stream, exc, stream, durable)

    async def start(self) -> None:
        await self.state.claim_shards()  # a process of another shard count would lose jobs: refuse, having made nothing
        await self.bus.ensure_streams()
        await self.state.load_scripts()  # SCRIPT LOAD once; transitions then run by EVALSHA
        # consumers first, state second: a change published while the state loads is then seen twice (handlers
        # are idempotent) rather than never (ephemeral consumers start from new messages)
        self._consumers = self.consumers()
        for c in self._consumers:  # a Redis outage (restart, failover) blames no message: wait it out
            c.outage = c.outage or is_outage
        for c in self._consumers:
            await c.start()
        await self.prepare()
        for c in self._consumers:
            self._tasks.append(asyncio.create_task(c.run(), name=f"{self.name}:{c.durable}"))
        for name, every, fn in self.periodic():
            if every > 0:
                self._tasks.append(
                    asyncio.create_task(self._every(name, every, fn), name=f"{self.name}:{name}")
                )
        self._started = True
        self.log.info(
            "%s started: %d consumers, namespace %r", self.name, len(self._consumers), self.settings.namespace
        )

    def readiness(self) -> str | None:
        """Why this service is not ready (``/readyz``), or None."""
        return health.consumers_readiness(self._started, self._consumers, self._tasks, self._stopping.is_set())

    async def _every(self, name: str, every: float, fn: Callable[[], Awaitable[None]]) -> None:
        while not self._stopping.is_set():
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=every)
                return
            except TimeoutError:
                pass
            try:
                await fn()
            except Exception as exc:  # a periodic job must survive a Redis/NATS hiccup
                if is_outage(exc):  # a server down or failing over: expected, and retried at the next tick
                    self.log.warning("periodic %s skipped: a server is not answering (%s: %s)", name,
                                     type(exc).__name__, exc)
                else:
                    self.log.exception("periodic %s failed", name)

    async def stop(self, close: bool = True) -> None:
        self._stopping.set()
        for c in self._consumers:
            c.stop()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=5)
            for t in pending:
                t.cancel()
        self._tasks.clear()
        if close:
            await self.bus.close()
            await self.state.close()
        self.log.info("%s stopped", self.name)
