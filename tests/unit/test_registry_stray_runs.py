"""Runs a node goes on listing after their stop: a cancelled or ended job still in a node's heartbeats a command
time-out later gets its stop again, under a new id, once per time-out; a job that may be wanted never does."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from services.registry.service import NodeRegistry
from shared.bus import MemoryBus
from shared.events import Command, Heartbeat, decode, now
from shared.state.memory_store import MemoryState
from tests.registry_rig import Clock, delivery, running_registry

pytestmark = pytest.mark.unit


class _Rig:
    def __init__(self, reg: NodeRegistry, bus: MemoryBus, store: MemoryState) -> None:
        self.reg, self.bus, self.store = reg, bus, store
        self.clock = Clock()
        reg.stray.clock = self.clock
        self.seq = 0

    async def heartbeat(self, *running: str) -> None:
        self.seq += 1
        hb = Heartbeat(id=f"hb-{self.seq}", node="n1", seq=self.seq, at=now(), running=running)
        await self.reg.on_heartbeat([delivery(self.bus.subjects.node_heartbeat("n1"), self.seq, hb)])

    async def sweep_after(self, seconds: float, *running: str) -> int:
        """``seconds`` later, a heartbeat listing ``running``, then a sweep: the stops it sent."""
        self.clock.t += seconds
        await self.heartbeat(*running)
        return await self.reg.stray.sweep()

    def stops(self) -> list[Command]:
        subject = self.bus.subjects.cmd("n1")
        cmds = [decode(s, d, self.bus.subjects) for s, d, _ in self.bus.sent if s == subject]
        return [c for c in cmds if c.kind == "stop"]


async def _running() -> _Rig:
    reg, bus, store, _ = await running_registry()
    return _Rig(reg, bus, store)


def _stray_stops() -> float:
    return REGISTRY.get_sample_value("migsched_registry_stray_stops_total") or 0.0


async def test_a_cancelled_job_still_running_a_time_out_later_is_stopped_again_once_per_time_out() -> None:
    rig = await _running()
    grace = rig.reg.stray.grace_s
    assert (await rig.store.cancel("j1", "by request", now())).status == "stop"  # its stop never arrives
    before = _stray_stops()
    assert await rig.sweep_after(1, "j1") == 0  # first seen stray
    assert await rig.sweep_after(grace - 2, "j1") == 0  # a stop that arrived may still be ending the run
    assert await rig.sweep_after(2, "j1") == 1
    [stop] = rig.stops()
    assert (stop.job_id, stop.node, stop.src_instance_id) == ("j1", "n1", None)
    assert stop.cmd_id.startswith("stop:j1:stray:n1:")  # not the cancel's own id, which the stream would drop
    assert await rig.sweep_after(grace / 2, "j1") == 0
    assert await rig.sweep_after(grace / 2, "j1") == 1  # once per time-out while it runs on
    assert _stray_stops() - before == 2


async def test_a_run_that_ends_after_its_stop_is_not_stopped_again() -> None:
    rig = await _running()
    await rig.store.cancel("j1", "by request", now())
    assert await rig.sweep_after(1, "j1") == 0
    assert await rig.sweep_after(rig.reg.stray.grace_s + 1) == 0  # the next heartbeat no longer lists it
    assert rig.stops() == []


async def test_a_job_the_state_has_running_is_never_stopped() -> None:
    rig = await _running()
    for _ in range(5):
        assert await rig.sweep_after(rig.reg.stray.grace_s, "j1") == 0
    assert rig.stops() == []


async def test_a_run_of_a_job_the_state_no_longer_holds_is_stopped_after_a_time_out() -> None:
    rig = await _running()
    assert await rig.sweep_after(1, "j1", "gone") == 0
    assert await rig.sweep_after(rig.reg.stray.grace_s, "j1", "gone") == 1
    assert [s.job_id for s in rig.stops()] == ["gone"]


async def test_a_node_whose_heartbeats_stopped_is_left_to_its_resync() -> None:
    rig = await _running()
    assert await rig.sweep_after(1, "gone") == 0
    rig.clock.t += 3 * rig.reg.stray.grace_s  # no heartbeat since
    assert await rig.reg.stray.sweep() == 0
    assert rig.stops() == []
