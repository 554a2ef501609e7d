"""A node registry on the in-memory bus and store with one job running on ``n1``, and what its handlers need:
deliveries made by hand and a clock the test moves."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

from services.registry.service import NodeRegistry
from shared.bus import Delivery, MemoryBus
from shared.settings import RegistrySettings, load
from shared.state.memory_store import MemoryState
from tests.contract.state_cases.earlier_exit import IDLE, with_idle_instance
from tests.contract.state_cases.late_run import place, start


class _Msg:
    def __init__(self, subject: str, seq: int) -> None:
        self.subject, self.stream_seq, self.deliveries, self.headers, self.data = subject, seq, 1, None, b""


def delivery(subject: str, seq: int, data: Any) -> Delivery:
    """``data`` as a handler receives it, delivered once from stream sequence ``seq``."""
    return Delivery(_Msg(subject, seq), data, trace.INVALID_SPAN, None)  # type: ignore[arg-type]


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


async def running_registry() -> tuple[NodeRegistry, MemoryBus, MemoryState, int]:
    """A registry whose store has job ``j1`` running on ``IDLE`` (node ``n1``); the place attempt that started it."""
    store = MemoryState()
    await with_idle_instance(store)
    attempt = await place(store, "j1", IDLE, "reuse")
    assert await start(store, "j1", IDLE, attempt) == "ok"
    st = load(RegistrySettings, env={}, metrics_port=0)
    bus = MemoryBus(st)
    await bus.ensure_streams()
    return NodeRegistry(st, bus, store), bus, store, attempt
