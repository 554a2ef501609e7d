"""A resync (the scheduler lost the node, or never saw it register) stops every workload the executor runs,
not only those the heartbeat it answers listed: a job started after that heartbeat would otherwise keep
running on an instance the next registration hands back to the scheduler as idle."""

from __future__ import annotations

import pytest
from test_executor_commands import Rig, is_done, place, rig  # noqa: F401  (rig: the fixture)

from shared.events import Command, JobExited, Registered, now

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def test_a_resync_stops_every_running_job_then_registers_again(rig: Rig) -> None:  # noqa: F811
    await rig.send(place("c1", "j1", 0, "1g.5gb", 0, duration=600))
    await rig.send(place("c2", "j2", 1, "1g.5gb", 0, duration=600))  # started after the heartbeat below
    await rig.watch.until(is_done("c1"))
    await rig.watch.until(is_done("c2"))
    assert sorted(rig.executor.backend.running()) == ["j1", "j2"]
    registrations = len(rig.watch.of(Registered))

    await rig.send(
        Command(id="r1", cmd_id="r1", kind="resync", node="n1", stop_jobs=("j1",), at=now())
    )
    await rig.watch.until(is_done("r1"))
    assert rig.executor.backend.running() == {}
    for job in ("j1", "j2"):
        ex = await rig.watch.until(lambda m, job=job: isinstance(m, JobExited) and m.job_id == job)
        assert ex.exit == "cancelled"
    await rig.watch.until(lambda m: len(rig.watch.of(Registered)) > registrations)
    reg = rig.watch.of(Registered)[-1]
    # the instances stay, free, for the scheduler to adopt (job ids in the report are not asserted: the sim's
    # job table drops a stopped job a moment after stop_workload returns)
    assert sorted((g.index, i.profile) for g in reg.gpus for i in g.instances) == [(0, "1g.5gb"), (1, "1g.5gb")]
