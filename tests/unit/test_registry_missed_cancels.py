"""Cancels the registry's consumer skipped when its leader changed are read back and applied, and only those."""

from __future__ import annotations

import time

import pytest
from prometheus_client import REGISTRY

from services.registry.cancels import CONSUMER
from services.registry.service import NodeRegistry
from shared.bus import Delivery, MemoryBus
from shared.events import JobCancel, decode, now
from shared.state.memory_store import MemoryState
from tests.registry_rig import Clock, running_registry

pytestmark = pytest.mark.unit


def _applied() -> float:
    return REGISTRY.get_sample_value("migsched_registry_missed_cancels_total") or 0.0


async def _rig() -> tuple[NodeRegistry, MemoryBus, MemoryState, Clock]:
    reg, bus, store, _ = await running_registry()
    clock = Clock()
    clock.t = time.time()
    reg.cancels.read_back.clock = clock

    async def drop(ds: list[Delivery]) -> None:
        return None

    consumer = bus.consumer(bus.subjects.stream_jobs, CONSUMER, bus.subjects.jobs_cancel, drop)
    await consumer.start()
    return reg, bus, store, clock


async def _skipped_then_looked_back(reg: NodeRegistry, bus: MemoryBus, clock: Clock) -> int:
    """The consumer skips the next cancel and changes leader; the cancels applied once the grace is over."""
    assert bus.skip(bus.subjects.stream_jobs, CONSUMER) > 0
    bus.elect(bus.subjects.stream_jobs, CONSUMER)
    clock.t += 5
    assert await reg.cancels.apply_skipped() == 0  # the change is seen; a redelivery may still come
    clock.t += reg.cancels.read_back.grace_s
    return await reg.cancels.apply_skipped()


async def test_a_cancel_skipped_across_a_change_of_leader_stops_its_running_job() -> None:
    reg, bus, store, clock = await _rig()
    before = _applied()
    assert await reg.cancels.apply_skipped() == 0  # the first look notes the leader
    await bus.publish(bus.subjects.jobs_cancel, JobCancel(id="c-1", job_id="j1", reason="user", at=now()))
    assert await _skipped_then_looked_back(reg, bus, clock) == 1
    rec = await store.job("j1")
    assert rec is not None and rec.cancel and rec.state == "running"  # flagged: its exit ends it
    sent = [decode(s, d, bus.subjects) for s, d, _ in bus.sent if s == bus.subjects.cmd("n1")]
    assert [(c.kind, c.job_id) for c in sent] == [("stop", "j1")]
    assert _applied() - before == 1


async def test_a_cancel_the_state_shows_applied_is_not_applied_again() -> None:
    reg, bus, store, clock = await _rig()
    await reg.cancels.apply_skipped()
    cancel = JobCancel(id="c-1", job_id="j1", reason="user", at=now())
    await bus.publish(bus.subjects.jobs_cancel, cancel)
    await store.cancel("j1", "user", now())  # the consumer delivered it, and it was applied
    assert await _skipped_then_looked_back(reg, bus, clock) == 0
    assert not [s for s, _, _ in bus.sent if s == bus.subjects.cmd("n1")]


async def test_a_cancel_of_a_job_never_submitted_leaves_its_tombstone() -> None:
    reg, bus, store, clock = await _rig()
    await reg.cancels.apply_skipped()
    await bus.publish(bus.subjects.jobs_cancel, JobCancel(id="c-2", job_id="later", at=now()))
    assert await _skipped_then_looked_back(reg, bus, clock) == 1
    rec = await store.job("later")
    assert rec is not None and rec.state == "cancelled"  # a submit arriving now is a no-op
