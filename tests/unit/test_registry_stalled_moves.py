"""A move whose target copy runs but which never completed (a report or its ``migrate_stop`` skipped): once the
target node has listed the copy, started by the move's ``migrate_start``, for a command time-out, the source gets
its ``migrate_stop`` again, and that command's answer commits the move. Anything else is left alone."""

from __future__ import annotations

import time

import pytest
from prometheus_client import REGISTRY

from services.registry.service import NodeRegistry
from shared.bus import MemoryBus
from shared.events import CmdDone, Command, Heartbeat, RunStart, decode, now
from shared.settings import RegistrySettings, load
from shared.state.memory_store import MemoryState
from tests.contract.state_cases.migration_exit import moving_away
from tests.registry_rig import Clock, delivery

pytestmark = pytest.mark.unit
START = "mig:k1:m1:start"
"""The ``migrate_start`` of ``moving_away``'s move (its target is ``n2/0:1g.5gb@6:k1.m1``)."""


class _Rig:
    def __init__(self, reg: NodeRegistry, bus: MemoryBus, store: MemoryState) -> None:
        self.reg, self.bus, self.store = reg, bus, store
        self.clock = Clock()
        reg.listed.clock = self.clock
        self.seq = 0

    async def sweep_after(self, seconds: float, node: str = "n2", started_by: str = START) -> int:
        """``seconds`` later, a heartbeat of ``node`` listing ``k1`` as started by ``started_by``, then a sweep."""
        self.clock.t += seconds
        self.seq += 1
        hb = Heartbeat(id=f"hb-{self.seq}", node=node, seq=self.seq, at=now(), running=("k1",),
                       started=(RunStart(job_id="k1", cmd_id=started_by),))
        await self.reg.on_heartbeat([delivery(self.bus.subjects.node_heartbeat(node), self.seq, hb)])
        return (await self.reg.check_listed_runs())[1]

    def sent(self, node: str) -> list[Command]:
        subject = self.bus.subjects.cmd(node)
        return [decode(s, d, self.bus.subjects) for s, d, _ in self.bus.sent if s == subject]


async def _moving() -> _Rig:
    store = MemoryState()
    await moving_away(store, "k1")
    st = load(RegistrySettings, env={}, metrics_port=0)
    bus = MemoryBus(st)
    await bus.ensure_streams()
    return _Rig(NodeRegistry(st, bus, store), bus, store)


def _resumed() -> float:
    return REGISTRY.get_sample_value("migsched_registry_moves_resumed_total") or 0.0


async def test_a_move_whose_target_copy_ran_a_time_out_gets_its_migrate_stop_again_and_then_commits() -> None:
    rig = await _moving()
    grace = rig.reg.listed.grace_s
    before = _resumed()
    assert await rig.sweep_after(1) == 0  # first seen
    assert await rig.sweep_after(grace - 2) == 0  # its own migrate_stop may still be on its way
    assert await rig.sweep_after(2) == 1
    [stop] = rig.sent("n1")
    job = await rig.store.job("k1")
    assert job is not None
    assert (stop.kind, stop.job_id, stop.src_instance_id, stop.instance_id) == ("migrate_stop", "k1", job.inst,
                                                                                 job.mig_inst)
    assert stop.cmd_id.startswith("mig:k1:m1:stop:")  # not the first stop's id, which the stream would drop
    assert await rig.sweep_after(grace / 2) == 0
    assert await rig.sweep_after(grace / 2) == 1  # once per time-out while the move stays stalled
    assert _resumed() - before == 2
    done = CmdDone(id=f"{stop.cmd_id}.done", node="n1", at=time.time(), cmd_id=stop.cmd_id, command="migrate_stop",
                   job_id="k1")
    await rig.reg.reports.on_report([delivery(rig.bus.subjects.node_report("n1"), 100, done)])
    job = await rig.store.job("k1")
    assert job is not None and (job.state, job.gpu, job.mig_gpu) == ("running", "n2/0", "")
    assert await rig.sweep_after(grace) == 0  # moved: nothing left to resume


async def test_a_move_whose_target_never_started_its_copy_is_not_resumed() -> None:
    rig = await _moving()
    for _ in range(3):  # the source lists the job as its placement started it; the target lists nothing
        assert await rig.sweep_after(rig.reg.listed.grace_s, node="n1", started_by="place:k1:0") == 0
    assert rig.sent("n1") == []


async def test_a_copy_started_by_another_move_does_not_resume_this_one() -> None:
    rig = await _moving()
    for _ in range(3):
        assert await rig.sweep_after(rig.reg.listed.grace_s, started_by="mig:k1:m0:start") == 0
    assert rig.sent("n1") == []
