"""The registry's side of the exits a heartbeat repeats, on the in-memory bus and store: one repeated by several
heartbeats of a batch is applied once, and one whose batch failed after its release (the ``jobs.exit`` publish
refused) is applied again when the heartbeats come back, so that its exit goes out."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from prometheus_client import REGISTRY

from services.registry.service import NodeRegistry
from shared.bus import Delivery, MemoryBus
from shared.bus.errors import BusError
from shared.events import Heartbeat, JobExit, JobExited, ToldExit, decode, now
from shared.settings import RegistrySettings, load
from shared.state.memory_store import MemoryState
from tests.contract.state_cases.earlier_exit import IDLE, with_idle_instance
from tests.contract.state_cases.late_run import place, start

pytestmark = pytest.mark.unit


class _Msg:
    def __init__(self, subject: str, seq: int) -> None:
        self.subject, self.stream_seq, self.deliveries, self.headers, self.data = subject, seq, 1, None, b""


async def _running() -> tuple[NodeRegistry, MemoryBus, MemoryState, JobExited]:
    store = MemoryState()
    await with_idle_instance(store)
    attempt = await place(store, "j1", IDLE, "reuse")
    assert await start(store, "j1", IDLE, attempt) == "ok"
    st = load(RegistrySettings, env={}, metrics_port=0)
    bus = MemoryBus(st)
    await bus.ensure_streams()
    lost = JobExited(id="exit-1", node="n1", at=now(), job_id="j1", gpu_index=0, instance_id=IDLE.id,
                     started_by=f"place:j1:{attempt}")
    return NodeRegistry(st, bus, store), bus, store, lost


def _heartbeats(bus: MemoryBus, *listed: tuple[JobExited, ...]) -> list[Delivery]:
    subject = bus.subjects.node_heartbeat("n1")
    return [Delivery(_Msg(subject, seq), Heartbeat(id=f"hb-{seq}", node="n1", seq=seq, at=now(),  # type: ignore[arg-type]
                                                    exits=tuple(ToldExit.of(e) for e in exits)),
                     trace.INVALID_SPAN, None)
            for seq, exits in enumerate(listed, 1)]


def _missed() -> float:
    return REGISTRY.get_sample_value("migsched_registry_missed_exits_total") or 0.0


def _exits(bus: MemoryBus) -> list[JobExit]:
    subject = bus.subjects.jobs_exit
    return [decode(s, d, bus.subjects) for s, d, _ in bus.sent if s == subject]


async def test_an_exit_several_heartbeats_of_a_batch_repeat_is_applied_once() -> None:
    reg, bus, store, lost = await _running()
    before = _missed()
    await reg.on_heartbeat(_heartbeats(bus, (lost,), (lost,), (lost,)))
    assert (await store.job("j1")).state == "finished"  # type: ignore[union-attr]
    assert _missed() - before == 1
    assert [(e.job_id, e.kind) for e in _exits(bus)] == [("j1", "completed")]
    await reg.on_heartbeat(_heartbeats(bus, (lost,)))  # applied: passed over without a read
    assert _missed() - before == 1 and len(_exits(bus)) == 1


async def test_an_exit_applied_from_a_heartbeat_whose_publish_failed_goes_out_when_the_heartbeat_comes_back() -> None:
    reg, bus, store, lost = await _running()
    batch = _heartbeats(bus, (lost,))
    bus.closed = True  # the release is applied, then the jobs.exit publish is refused
    with pytest.raises(BusError):
        await reg.on_heartbeat(batch)
    assert (await store.job("j1")).state == "finished"  # type: ignore[union-attr]
    assert _exits(bus) == []
    bus.closed = False
    await reg.on_heartbeat(batch)  # the batch comes back: the job has ended, and its exit goes out all the same
    assert [(e.job_id, e.kind, e.instance_id) for e in _exits(bus)] == [("j1", "completed", IDLE.id)]
