"""A ``stop`` that names the run it ends (``src_instance_id``: the registry's stop of a run a late place command
started, docs/architecture.md, data flow step 6) ends the job only where it runs on that instance: the job's
current run on another instance of the node carries on. The rig of ``test_executor_commands.py`` (a real NATS, the sim
backend)."""

from __future__ import annotations

import pytest

from shared.events import CmdDone, Command, JobExited, now
from tests.integration.test_executor_commands import Rig, is_done, place, rig  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def test_a_stop_naming_another_instance_leaves_the_job_running_and_one_naming_its_own_ends_it(
    rig: Rig,  # noqa: F811
) -> None:
    await rig.send(place("c1", "j1", 0, "3g.20gb", 4))
    await rig.watch.until(is_done("c1"))
    there = "n1/0:3g.20gb@4:j1"
    elsewhere = "n1/1:3g.20gb@4:j1"
    await rig.send(Command(id="s1", cmd_id="s1", kind="stop", node="n1", gpu_index=1, instance_id=elsewhere,
                           src_instance_id=elsewhere, job_id="j1", at=now()))
    assert isinstance(await rig.watch.until(is_done("s1")), CmdDone)  # confirmed: that run is not here
    assert "j1" in rig.executor.backend.running()
    assert not [m for m in rig.watch.of(JobExited) if m.job_id == "j1"]
    await rig.send(Command(id="s2", cmd_id="s2", kind="stop", node="n1", gpu_index=0, instance_id=there,
                           src_instance_id=there, job_id="j1", at=now()))
    exited = await rig.watch.until(lambda m: isinstance(m, JobExited) and m.job_id == "j1")
    assert (exited.exit, exited.instance_id) == ("cancelled", there)
    assert "j1" not in rig.executor.backend.running()
