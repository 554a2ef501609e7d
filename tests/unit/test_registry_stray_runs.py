"""Runs a node goes on listing after their stop: a cancelled or ended job still in a node's heartbeats a command
time-out later gets its stop again, under a new id, once per time-out; so does a run of a job queued again or
placed on another node, by a stop that names the command that started it; the job's own placement never does."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from services.registry.service import NodeRegistry
from shared.bus import MemoryBus
from shared.events import Command, Heartbeat, RunStart, decode, now
from shared.state import StoredInstance
from shared.state.memory_store import MemoryState
from tests.contract.state_cases.earlier_exit import IDLE
from tests.contract.state_cases.late_run import P1, place
from tests.registry_rig import Clock, delivery, running_registry

pytestmark = pytest.mark.unit


class _Rig:
    def __init__(self, reg: NodeRegistry, bus: MemoryBus, store: MemoryState) -> None:
        self.reg, self.bus, self.store = reg, bus, store
        self.clock = Clock()
        reg.listed.clock = self.clock
        self.seq = 0
        self.started: dict[str, str] = {}
        """What the node says started each run it lists (none: it names no command)."""

    async def heartbeat(self, *running: str) -> None:
        self.seq += 1
        started = tuple(RunStart(job_id=j, cmd_id=self.started[j]) for j in running if j in self.started)
        hb = Heartbeat(id=f"hb-{self.seq}", node="n1", seq=self.seq, at=now(), running=running, started=started)
        await self.reg.on_heartbeat([delivery(self.bus.subjects.node_heartbeat("n1"), self.seq, hb)])

    async def sweep_after(self, seconds: float, *running: str) -> int:
        """``seconds`` later, a heartbeat listing ``running``, then a sweep: the stops it sent."""
        self.clock.t += seconds
        await self.heartbeat(*running)
        return (await self.reg.check_listed_runs())[0]

    async def requeue(self) -> None:
        """``j1`` back in the queue (preempted, say) while ``n1`` goes on running it: its stop was lost."""
        assert (await self.store.release("j1", "preempted", "for an urgent job", now(), "", "", None)).state \
            == "pending"

    def stops(self) -> list[Command]:
        subject = self.bus.subjects.cmd("n1")
        cmds = [decode(s, d, self.bus.subjects) for s, d, _ in self.bus.sent if s == subject]
        return [c for c in cmds if c.kind == "stop"]


async def _running() -> _Rig:
    reg, bus, store, attempt = await running_registry()
    rig = _Rig(reg, bus, store)
    rig.started["j1"] = f"place:j1:{attempt}"
    return rig


def _stray_stops() -> float:
    return REGISTRY.get_sample_value("migsched_registry_stray_stops_total") or 0.0


async def test_a_cancelled_job_still_running_a_time_out_later_is_stopped_again_once_per_time_out() -> None:
    rig = await _running()
    grace = rig.reg.listed.grace_s
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
    assert await rig.sweep_after(rig.reg.listed.grace_s + 1) == 0  # the next heartbeat no longer lists it
    assert rig.stops() == []


async def test_a_job_the_state_has_running_is_never_stopped() -> None:
    rig = await _running()
    for _ in range(5):
        assert await rig.sweep_after(rig.reg.listed.grace_s, "j1") == 0
    assert rig.stops() == []


async def test_a_run_of_a_job_the_state_no_longer_holds_is_stopped_after_a_time_out() -> None:
    rig = await _running()
    assert await rig.sweep_after(1, "j1", "gone") == 0
    assert await rig.sweep_after(rig.reg.listed.grace_s, "j1", "gone") == 1
    assert [s.job_id for s in rig.stops()] == ["gone"]


async def test_a_node_whose_heartbeats_stopped_is_left_to_its_resync() -> None:
    rig = await _running()
    assert await rig.sweep_after(1, "gone") == 0
    rig.clock.t += 3 * rig.reg.listed.grace_s  # no heartbeat since
    assert (await rig.reg.check_listed_runs())[0] == 0
    assert rig.stops() == []


async def test_a_run_of_a_job_queued_again_is_stopped_by_a_stop_naming_the_command_that_started_it() -> None:
    rig = await _running()
    await rig.requeue()
    assert await rig.sweep_after(1, "j1") == 0
    assert await rig.sweep_after(rig.reg.listed.grace_s, "j1") == 1
    [stop] = rig.stops()
    # that run only: a placement of j1 on n1 meanwhile starts another run, which this stop does not end
    assert (stop.job_id, stop.src_cmd_id, stop.src_instance_id) == ("j1", rig.started["j1"], None)


async def test_a_run_of_a_job_placed_on_another_node_is_stopped() -> None:
    rig = await _running()
    await rig.requeue()
    await rig.store.register_node("n2", [{"id": "n2/0", "index": 0, "model": "A100-40GB", "mig": True,
                                          "healthy": True, "uuid": "GPU-n2-0", "instances": [], "replicas": 0,
                                          "jobs": []}], now(), "reg-n2")
    on_n2 = StoredInstance(id="n2/0:1g.5gb@0:j1", profile="1g.5gb", start=0, size=P1.memory_slices,
                           compute=P1.compute_slices)
    await place(rig.store, "j1", on_n2)
    assert await rig.sweep_after(1, "j1") == 0
    assert await rig.sweep_after(rig.reg.listed.grace_s, "j1") == 1
    [stop] = rig.stops()
    assert (stop.node, stop.src_cmd_id) == ("n1", rig.started["j1"])


async def test_a_run_on_the_node_of_the_jobs_placement_is_left_alone_whatever_command_started_it() -> None:
    rig = await _running()
    await rig.requeue()
    await place(rig.store, "j1", IDLE, "reuse")  # placed on n1 again: its new run may take the old one's place
    for _ in range(3):
        assert await rig.sweep_after(rig.reg.listed.grace_s, "j1") == 0
    assert rig.stops() == []


async def test_a_new_run_restarts_the_time_out() -> None:
    rig = await _running()
    await rig.requeue()
    assert await rig.sweep_after(1, "j1") == 0
    rig.started["j1"] = "place:j1:9"  # stopped meanwhile, and started again by a later command
    assert await rig.sweep_after(rig.reg.listed.grace_s, "j1") == 0
    assert await rig.sweep_after(rig.reg.listed.grace_s, "j1") == 1
    assert [s.src_cmd_id for s in rig.stops()] == ["place:j1:9"]


async def test_a_run_of_a_job_queued_again_whose_command_the_node_does_not_name_is_left_alone() -> None:
    rig = await _running()
    await rig.requeue()
    rig.started.clear()  # an executor that names no command: a stop could end a later run of the job
    for _ in range(3):
        assert await rig.sweep_after(rig.reg.listed.grace_s, "j1") == 0
    assert rig.stops() == []
