"""What the executor remembers, and for how long: a redelivered command is answered with the reports it got the
first time for as long as a redelivery can come (two ``ack_wait_s``), then forgotten; published exits
likewise; a hard cap holds at any rate. Time is an injected clock: no sleeps."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from typing import Any

import msgspec
import pytest

from services.common.stop_command import stop_command
from services.executor.instances import InstanceBook
from services.executor.recent import Recent
from services.executor.service import Executor, ExecutorSettings
from services.executor.sim_backend import SimBackend
from shared.bus import MemoryBus, Outgoing
from shared.events import CmdDone, CmdFailed, Command, JobExited, decode, encode, now
from shared.mig.geometry import default_geometry
from shared.policy.partition import MigOp
from shared.settings import load

pytestmark = pytest.mark.unit
NODE = "n1"
A100 = default_geometry().model("A100-40GB")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# --- the map itself -------------------------------------------------------------------------------------------


def test_an_entry_is_kept_for_the_whole_window() -> None:
    clock = Clock()
    r: Recent[str] = Recent(150.0, 1000, clock=clock)
    r.put("a", "reports of a")
    for dt in (0.0, 29.9, 30.0, 100.0, 149.99, 150.0):
        clock.t = 1000.0 + dt
        assert r.get("a") == "reports of a" and "a" in r, dt


def test_an_entry_older_than_the_window_and_a_generation_is_forgotten() -> None:
    clock = Clock()
    r: Recent[str] = Recent(150.0, 1000, clock=clock, generations=6)  # generations of 30 s
    r.put("a", "x")
    clock.t += 180.0  # window × 6/5: the latest it may stay
    assert r.get("a") is None and "a" not in r and len(r) == 0


def test_entries_expire_in_the_order_they_came_and_a_long_idle_spell_forgets_everything() -> None:
    clock = Clock()
    r: Recent[int] = Recent(100.0, 1000, clock=clock, generations=5)  # generations of 25 s
    for i in range(10):
        r.put(f"k{i}", i)
        clock.t += 25.0
    # now = start + 250 s: k6..k9 (put at 150..225 s) are within the window; k0..k4 (put at 0..100 s) are over
    # window × 5/4 old; k5 (125 s old) is at that limit, either way
    kept = [k for k in (f"k{i}" for i in range(10)) if k in r]
    assert kept[-4:] == ["k6", "k7", "k8", "k9"] and not {"k0", "k1", "k2", "k3", "k4"} & set(kept)
    clock.t += 10_000.0
    assert len(r) == 0 and r.get("k9") is None
    r.put("new", 1)
    assert r.get("new") == 1


def test_the_cap_holds_whatever_the_rate_dropping_the_oldest_first() -> None:
    clock = Clock()
    r: Recent[int] = Recent(150.0, 600, clock=clock, generations=6)
    for i in range(10_000):  # all within one instant: the window alone would keep them all
        r.put(f"k{i}", i)
        assert len(r) <= 600
    assert r.get("k9999") == 9999 and r.get("k0") is None
    assert len(r) >= 500  # the cap is not a much smaller bound in disguise


def test_a_none_value_is_remembered_as_present() -> None:
    r: Recent[None] = Recent(10.0, 10, clock=Clock())
    r.put("job", None)
    assert "job" in r and "other" not in r


@pytest.mark.parametrize("kw", [{"window_s": 0.0, "cap": 10}, {"window_s": 1.0, "cap": 0},
                                {"window_s": 1.0, "cap": 10, "generations": 1}])
def test_a_nonsense_bound_is_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Recent(clock=Clock(), **kw)


# --- the executor's redelivery answers ---------------------------------------------------------------------------


def place(cmd_id: str, job: str, gpu: int, profile: str, start: int) -> Command:
    p = A100.profile(profile)
    iid = f"{NODE}/{gpu}:{profile}@{start}:{job}"
    ops = tuple(MigOp(kind=k, gpu_id=f"{NODE}/{gpu}", instance_id=iid, profile=p.name, profile_id=p.profile_id,
                      start=start, size=p.memory_slices) for k in ("create_gi", "create_ci"))
    return Command(id=cmd_id, cmd_id=cmd_id, kind="place", node=NODE, gpu_id=f"{NODE}/{gpu}", gpu_index=gpu,
                   ops=ops, instance_id=iid, job_id=job, at=now(), submitted_at=now())


class Rig:
    def __init__(self) -> None:
        self.clock = Clock()
        self.settings = load(ExecutorSettings, env={}, node=NODE, ack_wait_s=30.0, max_deliver=5, metrics_port=0)
        self.bus = MemoryBus(self.settings)
        self.backend = SimBackend(node=NODE, models=["A100-40GB"] * 2, reconfig_latency_s=0.0)
        self.ex = Executor(self.bus, self.backend, self.settings, NODE, clock=self.clock)
        self.commands = self.ex.command_consumer()
        self.delivered = 0
        self.applied: list[str] = []
        real = self.ex.apply

        async def counting(cmd: Command, ctx: Any) -> list[Any]:
            self.applied.append(cmd.cmd_id)
            return await real(cmd, ctx)

        self.ex.apply = counting  # type: ignore[method-assign]

    async def deliver(self, cmd: Command) -> list[Any]:
        """Hand the command over as one fetched batch (a stream message of its own, as a redelivery is); the
        reports published for it."""
        await self.bus.ensure_streams()
        self.delivered += 1
        await self.bus.publish(self.bus.subjects.cmd(NODE), cmd, msg_id=f"{cmd.id}#{self.delivered}")
        before = len(self.bus.sent)
        assert await self.commands.poll() == 1
        return [decode(subject, data, self.bus.subjects) for subject, data, _ in self.bus.sent[before:]]


async def test_the_window_is_two_acknowledgement_waits() -> None:
    rig = Rig()
    assert Executor.redelivery_window_s(rig.settings) == 60.0


async def test_a_redelivery_within_the_window_gets_the_identical_reports_without_applying_again() -> None:
    rig = Rig()
    cmd = place("c1", "j1", 0, "1g.5gb", 0)
    first = await rig.deliver(cmd)
    assert len(first) == 1 and isinstance(first[0], CmdDone) and first[0].instance is not None
    for dt in (0.5, 30.0, 45.0, 60.0):  # a nak'd retry, then an ack lost (back after one ack wait), a slow one
        rig.clock.t = 1000.0 + dt
        again = await rig.deliver(cmd)
        assert again == first, dt  # same ids, same `at`, same instance report: the stream drops copies
    assert rig.applied == ["c1"]
    subject = rig.bus.subjects.node_report(NODE)
    assert {s for s, _, _ in rig.bus.sent} == {subject, rig.bus.subjects.cmd(NODE)}


async def test_a_failed_command_is_answered_with_its_failure_again() -> None:
    rig = Rig()
    await rig.deliver(place("c1", "j1", 0, "7g.40gb", 0))
    overlapping = place("c2", "j2", 0, "1g.5gb", 0)
    # the refusal (and the registration that follows it, for the drift it shows)
    first = [m for m in await rig.deliver(overlapping) if isinstance(m, CmdFailed | CmdDone)]
    assert len(first) == 1 and isinstance(first[0], CmdFailed)
    assert await rig.deliver(overlapping) == first
    assert rig.applied == ["c1", "c2"]


async def test_every_placement_refused_for_overlap_is_followed_at_once_by_a_registration_that_shows_the_drift() -> None:
    rig = Rig()
    await rig.deliver(place("c1", "j1", 0, "7g.40gb", 0))  # the instance the state will not know about
    subject = rig.bus.subjects.node_report(NODE)
    for n, cmd in enumerate((place("c2", "j2", 0, "1g.5gb", 0), place("c3", "j2", 0, "1g.5gb", 0))):
        before = len(rig.bus.sent)
        reports = await rig.deliver(cmd)
        subjects = [s for s, _, _ in rig.bus.sent[before + 1:]]  # after the command itself
        kinds = [type(m).__name__ for m in reports]
        # the failure first, then the registration, on one subject: the registry frees the slot, then adopts
        assert kinds == ["CmdFailed", "Registered"] and set(subjects) == {subject}, n
        gpu0 = next(g for g in reports[1].gpus if g.index == 0)
        assert [(i.profile, i.start) for i in gpu0.instances] == [("7g.40gb", 0)], n
    await rig.backend.close()


async def test_a_start_refused_because_its_instance_runs_another_job_is_followed_by_a_registration_showing_it(
) -> None:
    rig = Rig()
    await rig.deliver(place("c1", "j1", 0, "1g.5gb", 0))  # a run the state took for gone, its instance for idle
    reports = await rig.deliver(place("c2", "j2", 0, "1g.5gb", 0))
    assert [type(m).__name__ for m in reports] == ["CmdFailed", "Registered"]
    assert "busy with job j1" in reports[0].error
    gpu0 = next(g for g in reports[1].gpus if g.index == 0)
    assert [(i.profile, i.start, i.job_id, i.started_by) for i in gpu0.instances] == [("1g.5gb", 0, "j1", "c1")]
    await rig.backend.close()


async def test_a_command_older_than_the_window_is_applied_again_as_an_unknown_one_and_finds_its_work_done() -> None:
    rig = Rig()
    cmd = place("c1", "j1", 0, "1g.5gb", 0)
    first = await rig.deliver(cmd)
    rig.clock.t += 10_000.0
    again = await rig.deliver(cmd)
    assert rig.applied == ["c1", "c1"]
    # what a restarted executor does: the instance is not created twice, the job runs once, same report id
    assert [(i.profile, i.start) for i in await rig.backend.list_instances(0)] == [("1g.5gb", 0)]
    assert list(rig.backend.running()) == ["j1"]
    assert [m.id for m in again] == [m.id for m in first] == ["c1.done"]
    await rig.backend.close()


async def test_the_remembered_commands_stay_within_the_window_at_a_steady_rate() -> None:
    rig = Rig()
    rate = 50  # commands per second, each handled once
    for i in range(400 * rate):  # 400 s in steps of 0.1 s, 5 commands each
        if i % 5 == 0:
            rig.clock.t += 0.1
        rig.ex._remember(f"c{i}", [Outgoing("s", CmdDone(id=f"c{i}.done", node=NODE, at=1.0, cmd_id=f"c{i}",
                                                            command="destroy_idle"))])
    # at most window × 6/5 of them (60-72 s worth), never fewer than the window's
    assert 60 * rate <= len(rig.ex._done) <= 72 * rate + 5
    await rig.backend.close()


async def test_published_exits_are_remembered_for_the_window_then_forgotten() -> None:
    rig = Rig()
    rig.ex.exits.published("j1")
    rig.clock.t += 60.0
    assert "j1" in rig.ex.exits.recent
    await rig.ex.exits.reported("j1", timeout=0.0)  # known: returns at once
    rig.clock.t += 12.0
    assert "j1" not in rig.ex.exits.recent
    await rig.backend.close()


async def test_a_remembered_report_is_its_compressed_json_and_replays_as_sent() -> None:
    rig = Rig()
    done = CmdDone(id="c1.done", node=NODE, at=1.5, cmd_id="c1", command="destroy_idle")
    failed = CmdFailed(id="c2.failed", node=NODE, at=2.5, cmd_id="c2", command="place", job_id="j", error="x" * 2000)
    subject = rig.bus.subjects.node_report(NODE)
    rig.ex._remember("c2", [Outgoing(subject, failed)])
    rig.ex._remember("c1", [Outgoing(subject, done)])
    rig.ex._remember("c3", [Outgoing(subject, done), Outgoing(subject, failed)])
    kept = rig.ex._done.get("c1")
    assert isinstance(kept, bytes) and zlib.decompress(kept) == encode(done)
    assert zlib.decompress(rig.ex._done.get("c2")) == encode(failed)  # type: ignore[arg-type]
    assert len(rig.ex._done.get("c2")) < len(encode(failed)) // 10  # type: ignore[arg-type]
    assert [o.msg for o in rig.ex._replayed(subject, rig.ex._done.get("c3"), None)] == [done, failed]  # type: ignore[arg-type]
    await rig.backend.close()


async def test_a_destroy_is_refused_only_for_an_instance_busy_on_the_commands_own_gpu() -> None:
    rig = Rig()
    await rig.deliver(place("c1", "j1", 0, "1g.5gb", 0))
    await rig.deliver(place("c2", "j2", 1, "1g.5gb", 0))
    await rig.backend.stop_workload("j2")  # GPU 1's instance is idle now; GPU 0's (same GI id) still busy
    (gi,) = [i.gi_id for i in await rig.backend.list_instances(0)]
    assert [i.gi_id for i in await rig.backend.list_instances(1)] == [gi]

    def destroy(cmd_id: str, gpu: int) -> Command:
        ops = tuple(msgspec.structs.replace(op, kind=kind) for op, kind in
                    zip(place(cmd_id, f"j{gpu + 1}", gpu, "1g.5gb", 0).ops, ("destroy_ci", "destroy_gi"), strict=True))
        return Command(id=cmd_id, cmd_id=cmd_id, kind="destroy_idle", node=NODE, gpu_index=gpu, ops=ops, at=now())

    (refused,) = await rig.deliver(destroy("c3", 0))
    assert isinstance(refused, CmdFailed) and "a workload still runs on it" in refused.error  # the executor's check
    (freed,) = await rig.deliver(destroy("c4", 1))
    assert isinstance(freed, CmdDone) and await rig.backend.list_instances(1) == []
    await rig.backend.close()


async def test_an_exit_whose_run_the_tables_lost_still_names_the_instance_it_ran_on() -> None:
    rig = Rig()
    cmd = place("c1", "j1", 0, "1g.5gb", 0)
    await rig.deliver(cmd)
    rig.ex.runs.instance.pop("j1")  # as when another run's exit took the entry
    reporting = asyncio.create_task(rig.ex.exits.run())
    try:
        await rig.backend.stop_workload("j1")
        exits: list[JobExited] = []
        for _ in range(200):
            exits = [m for s, d, _ in rig.bus.sent if isinstance(m := decode(s, d, rig.bus.subjects), JobExited)]
            if exits:
                break
            await asyncio.sleep(0.01)
        assert [(e.job_id, e.instance_id, e.gpu_index) for e in exits] == [("j1", cmd.instance_id, 0)]
    finally:
        reporting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporting
        await rig.backend.close()


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
    reporting = asyncio.create_task(rig.ex.exits.run())
    try:
        exits: list[JobExited] = []
        for _ in range(200):
            exits = [m for s, d, _ in rig.bus.sent if isinstance(m := decode(s, d, rig.bus.subjects), JobExited)]
            if len(exits) == 2:
                break
            await asyncio.sleep(0.01)
        assert [(e.instance_id, e.gpu_index) for e in exits] == [(first.instance_id, 0), (second.instance_id, 1)]
    finally:
        reporting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporting
        await rig.backend.close()


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
