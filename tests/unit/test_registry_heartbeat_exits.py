"""The registry's side of the exits a heartbeat repeats, on the in-memory bus and store. An exit it has not
received waits while its report may only be late; it is applied once the consumer has gone past it (a later
report of the node arrived) or the grace is over, once however many heartbeats of a batch list it, and again when
its first application failed to publish the job's exit."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from services.registry.service import NodeRegistry
from shared.bus import MemoryBus
from shared.bus.errors import BusError
from shared.events import Drift, Heartbeat, JobExit, JobExited, ToldExit, decode, now
from shared.state.memory_store import MemoryState
from tests.contract.state_cases.earlier_exit import IDLE
from tests.registry_rig import Clock, delivery, running_registry

pytestmark = pytest.mark.unit


class _Rig:
    def __init__(self, reg: NodeRegistry, bus: MemoryBus, store: MemoryState, lost: JobExited) -> None:
        self.reg, self.bus, self.store, self.lost = reg, bus, store, lost
        self.clock = Clock()
        reg.missed.clock = self.clock

    async def heartbeats(self, *listed: tuple[JobExited, ...]) -> None:
        subject = self.bus.subjects.node_heartbeat("n1")
        await self.reg.on_heartbeat([
            delivery(subject, seq, Heartbeat(id=f"hb-{seq}", node="n1", seq=seq, at=now(),
                                             exits=tuple(ToldExit.of(e) for e in exits)))
            for seq, exits in enumerate(listed, 1)])

    async def later_report(self) -> None:
        """A report the node sent after the exit, received: the consumer went past the exit."""
        drift = Drift(id="drift-1", node="n1", at=self.lost.at + 1.0, details=("x",))
        await self.reg.reports.on_report([delivery(self.bus.subjects.node_report("n1"), 9, drift)])

    async def state(self) -> str:
        return (await self.store.job("j1")).state  # type: ignore[union-attr]

    def exits(self) -> list[JobExit]:
        subject = self.bus.subjects.jobs_exit
        return [decode(s, d, self.bus.subjects) for s, d, _ in self.bus.sent if s == subject]


async def _running() -> _Rig:
    reg, bus, store, attempt = await running_registry()
    lost = JobExited(id="exit-1", node="n1", at=now(), job_id="j1", gpu_index=0, instance_id=IDLE.id,
                     started_by=f"place:j1:{attempt}")
    return _Rig(reg, bus, store, lost)


def _missed() -> float:
    return REGISTRY.get_sample_value("migsched_registry_missed_exits_total") or 0.0


async def test_an_exit_not_received_waits_while_its_report_may_only_be_late() -> None:
    rig = await _running()
    await rig.heartbeats((rig.lost,), (rig.lost,))
    rig.clock.t = rig.reg.missed.grace_s - 1.0
    await rig.heartbeats((rig.lost,))
    assert await rig.state() == "running" and rig.exits() == []


async def test_an_exit_the_consumer_went_past_is_applied_once_however_many_heartbeats_list_it() -> None:
    rig = await _running()
    before = _missed()
    await rig.heartbeats((rig.lost,))
    await rig.later_report()
    await rig.heartbeats((rig.lost,), (rig.lost,), (rig.lost,))
    assert await rig.state() == "finished"
    assert _missed() - before == 1
    assert [(e.job_id, e.kind) for e in rig.exits()] == [("j1", "completed")]
    await rig.heartbeats((rig.lost,))  # applied: passed over
    assert _missed() - before == 1 and len(rig.exits()) == 1


async def test_an_exit_is_applied_after_the_grace_when_no_later_report_comes() -> None:
    rig = await _running()
    await rig.heartbeats((rig.lost,))
    rig.clock.t = rig.reg.missed.grace_s
    await rig.heartbeats(())  # the node's later heartbeats no longer list it
    assert await rig.state() == "finished"
    assert [(e.job_id, e.kind) for e in rig.exits()] == [("j1", "completed")]


async def test_an_exit_applied_from_a_heartbeat_whose_publish_failed_goes_out_at_the_next_heartbeat() -> None:
    rig = await _running()
    await rig.heartbeats((rig.lost,))
    await rig.later_report()
    rig.bus.closed = True  # the release is applied, then the jobs.exit publish is refused
    with pytest.raises(BusError):
        await rig.heartbeats(())
    assert await rig.state() == "finished"
    assert rig.exits() == []
    rig.bus.closed = False
    await rig.heartbeats(())  # the job has ended, and its exit goes out all the same
    assert [(e.job_id, e.kind, e.instance_id) for e in rig.exits()] == [("j1", "completed", IDLE.id)]
