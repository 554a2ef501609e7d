"""What the executor remembers, and for how long: a redelivered command is answered with the reports it got the
first time for as long as a redelivery can come (two ``ack_wait_s``), then forgotten; published exits
likewise; a hard cap holds at any rate. Time is an injected clock: no sleeps."""

from __future__ import annotations

import zlib
from typing import Any

import msgspec
import pytest

from services.common.recent import Recent
from services.executor.service import Executor
from shared.bus import Outgoing
from shared.events import CmdDone, CmdFailed, Command, JobExited, encode, now
from tests.executor_rig import NODE, Clock, Rig, place

pytestmark = pytest.mark.unit


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
    rig.ex.exits.published(JobExited(id="x1", node=NODE, at=1.0, job_id="j1"))
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
