"""Which run a stop or an exit belongs to: an exit names the instance its own run ended on, even once the job
runs again; a stop of one run leaves a newer one alone; every stop is carried out once, so a replay after the
redelivery window ends no run placed since. Time is an injected clock: no sleeps."""

from __future__ import annotations

import logging

import msgspec
import pytest

from services.common.stop_command import stop_command
from services.executor.instances import InstanceBook
from services.executor.sim_backend import SimBackend
from shared.events import CmdDone, Command, now
from shared.policy.partition import MigOp
from tests.executor_rig import A100, NODE, Rig, place

pytestmark = pytest.mark.unit


async def test_an_exit_whose_run_the_tables_lost_still_names_the_instance_it_ran_on() -> None:
    rig = Rig()
    cmd = place("c1", "j1", 0, "1g.5gb", 0)
    await rig.deliver(cmd)
    rig.ex.runs.instance.pop("j1")  # as when another run's exit took the entry
    async with rig.reporting():
        await rig.backend.stop_workload("j1")
        exits = await rig.exits(1)
        assert [(e.job_id, e.instance_id, e.gpu_index) for e in exits] == [("j1", cmd.instance_id, 0)]


async def test_an_earlier_runs_exit_reported_after_the_latest_run_ended_names_its_own_instance() -> None:
    # the job ran on GPU 0 and was stopped; placed anew, it ran on GPU 1 and ended too, before the first exit was
    # out (held back while its start report was not): each exit names its own run, or the first would end the
    # placement on GPU 1 in the state, which may be the one that runs the job
    rig = Rig()
    first, second = place("place:j:0", "j", 0, "1g.5gb", 0), place("place:j:1", "j", 1, "1g.5gb", 0)
    await rig.deliver(first)
    await rig.backend.stop_workload("j")
    await rig.deliver(second)
    await rig.backend.stop_workload("j")
    async with rig.reporting():
        exits = await rig.exits(2)
        assert [(e.instance_id, e.gpu_index, e.started_by) for e in exits] == [
            (first.instance_id, 0, "place:j:0"), (second.instance_id, 1, "place:j:1")]


async def test_an_earlier_runs_exit_on_the_instance_the_job_runs_on_again_names_the_command_that_started_it() -> None:
    # placed again on the very instance it ran on (reused): the instance cannot tell the runs apart, the command
    # that started each can (the registry judges an exit of an earlier attempt's run stale)
    rig = Rig()
    first = place("place:j:0", "j", 0, "1g.5gb", 0)
    again = msgspec.structs.replace(first, id="place:j:1", cmd_id="place:j:1", ops=())
    await rig.deliver(first)
    await rig.backend.stop_workload("j")
    await rig.deliver(again)
    assert "j" in rig.backend.running()
    async with rig.reporting():
        await rig.exits(1)
        await rig.backend.stop_workload("j")
        exits = await rig.exits(2)
        assert [(e.instance_id, e.started_by) for e in exits] == [
            (first.instance_id, "place:j:0"), (first.instance_id, "place:j:1")]


async def test_forgetting_a_name_whose_gi_id_was_reused_keeps_the_new_instances_name() -> None:
    backend = SimBackend(node=NODE, models=["A100-40GB"], reconfig_latency_s=0.0)
    book = InstanceBook(backend, {0: A100})
    p = A100.profile("1g.5gb")

    def create(iid: str, start: int) -> MigOp:
        return MigOp(kind="create_gi", gpu_id=f"{NODE}/0", instance_id=iid, profile=p.name, profile_id=p.profile_id,
                     start=start, size=p.memory_slices)

    await book.apply(0, [create("old", 2)], set())
    (old,) = await backend.list_instances(0)
    await backend.destroy_instance(0, old.gi_id)  # gone under another command's name: "old" is still known
    await book.apply(0, [create("new", 4)], set())
    (new,) = await backend.list_instances(0)
    assert new.gi_id == old.gi_id  # the backend reused the GI id
    assert await book.find(0, "old") is None  # looked up again: gone, so forgotten
    assert book.name_of(new) == "new"  # a stop naming another instance must not find this one nameless
    await backend.close()


async def test_a_stop_that_ends_a_run_it_cannot_tell_apart_is_logged_as_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="migsched.executor")
    rig = Rig()
    first = place("place:j:1", "j", 0, "1g.5gb", 0)
    await rig.deliver(first)
    await rig.deliver(stop_command(NODE, "j", "stop:j:1", f"{NODE}/0", first.instance_id, now(), only_that_run=True,
                                   started_by="place:j:1"))
    assert [r.levelno for r in caplog.records if "ends j" in r.getMessage()] == [logging.INFO]
    second = place("place:j:2", "j", 1, "1g.5gb", 0)
    await rig.deliver(second)
    rig.ex.runs.started_by.pop("j")  # no record of the command that started the run
    caplog.clear()
    await rig.deliver(stop_command(NODE, "j", "stop:j:2", f"{NODE}/1", second.instance_id, now(),
                                   only_that_run=True, started_by="place:j:2"))
    (record,) = [r for r in caplog.records if "ends j" in r.getMessage()]
    assert record.levelno == logging.WARNING and "started by an unknown command" in record.getMessage()
    assert "j" not in rig.backend.running()
    await rig.backend.close()


async def test_a_resync_replayed_after_the_window_leaves_the_runs_placed_since_running() -> None:
    rig = Rig()
    await rig.deliver(place("c1", "j1", 0, "1g.5gb", 0))
    resync = Command(id="resync:n1:1", cmd_id="resync:n1:1", kind="resync", node=NODE, stop_jobs=("j1",), at=now())
    first = await rig.deliver(resync)
    assert "j1" not in rig.backend.running() and any(isinstance(m, CmdDone) for m in first)
    await rig.deliver(place("c2", "j2", 1, "1g.5gb", 0))  # placed once the node registered again
    rig.clock.t += 120.0  # its acknowledgement lost twice: back after the window (60 s), within the horizon
    again = await rig.deliver(resync)
    assert rig.applied.count("resync:n1:1") == 2
    assert [m.id for m in again] == ["resync:n1:1.done"]  # answered, and nothing stopped or registered
    assert list(rig.backend.running()) == ["j2"]
    # a new loss of the node is a new resync: it stops what runs
    await rig.deliver(msgspec.structs.replace(resync, id="resync:n1:2", cmd_id="resync:n1:2", stop_jobs=("j2",)))
    assert rig.backend.running() == {}
    await rig.backend.close()


async def test_a_preempting_place_replayed_after_the_window_leaves_its_victim_running_where_it_was_placed_since(
) -> None:
    rig = Rig()
    await rig.deliver(place("c1", "victim", 0, "1g.5gb", 0))
    preempting = msgspec.structs.replace(place("c2", "urgent", 0, "1g.5gb", 1), stop_jobs=("victim",))
    await rig.deliver(preempting)
    assert list(rig.backend.running()) == ["urgent"]
    await rig.deliver(place("c3", "victim", 1, "1g.5gb", 0))  # re-queued by the preemption, placed again
    rig.clock.t += 120.0  # after the redelivery window, within the horizon
    again = await rig.deliver(preempting)
    assert [m.id for m in again] == ["c2.done"] and rig.applied.count("c2") == 2
    assert sorted(rig.backend.running()) == ["urgent", "victim"]
    await rig.backend.close()


async def test_every_run_a_resync_ends_is_logged_as_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="migsched.executor")
    rig = Rig()
    await rig.deliver(place("c1", "j1", 0, "1g.5gb", 0))
    await rig.deliver(place("c2", "j2", 1, "1g.5gb", 0))
    await rig.deliver(Command(id="r", cmd_id="r", kind="resync", node=NODE, stop_jobs=("j1",), at=now()))
    ends = [r for r in caplog.records if "resync r ends" in r.getMessage()]
    assert sorted(r.getMessage().split()[3] for r in ends) == ["j1", "j2"]
    assert {r.levelno for r in ends} == {logging.WARNING}
    await rig.backend.close()


async def test_a_stop_replayed_after_the_window_leaves_a_new_run_on_an_instance_of_the_same_id_running() -> None:
    rig = Rig()
    first = place("c1", "j", 0, "1g.5gb", 0)
    await rig.deliver(first)
    # a registration found the run where the state does not hold it: stop that run, named by its instance
    stop = stop_command(NODE, "j", "stop:j:reg-1", f"{NODE}/0", first.instance_id, now(), only_that_run=True)
    await rig.deliver(stop)
    assert "j" not in rig.backend.running()
    await rig.deliver(place("c2", "j", 0, "1g.5gb", 0))  # placed anew on the same slot: the same instance id
    rig.clock.t += 120.0  # after the redelivery window, within the horizon
    again = await rig.deliver(stop)
    assert [m.id for m in again] == ["stop:j:reg-1.done"] and rig.applied.count("stop:j:reg-1") == 2
    assert list(rig.backend.running()) == ["j"]
    await rig.backend.close()


async def test_the_stops_carried_out_are_remembered_for_the_redelivery_horizon() -> None:
    rig = Rig()
    assert rig.ex.commands.stopped.window_s == rig.settings.redelivery_horizon_s == 210.0
