"""The recorder's accounting: latencies from the intended submit instant, first sightings, losses."""

from __future__ import annotations

import msgspec
import pytest

from load.generator import new_histogram
from load.recorder import Recorder, summarize
from shared.events import Subjects

pytestmark = pytest.mark.unit

MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def wire(**fields: object) -> bytes:
    return msgspec.json.encode({"v": 1, "id": "x", **fields})


def test_latencies_run_from_the_intended_submit_instant_to_the_first_sighting() -> None:
    rec = Recorder("r", clock=Clock())
    rec.submitted("r-0", 10 * MS)
    rec.observe("placed", "r-0", 13 * MS)
    rec.observe("command", "r-0", 17 * MS)
    rec.observe("command", "r-0", 90 * MS)  # a redelivery: counted, not measured
    rec.observe("running", "r-0", 30 * MS)
    lat = rec.latencies()
    got = [lat[k].p50 for k in ("submit→placed", "submit→command", "submit→running", "placed→command",
                                "command→running")]
    assert got == pytest.approx([3.0, 7.0, 20.0, 4.0, 13.0], rel=1e-3)  # HDR: 3 significant digits
    assert rec.duplicates["command"] == 1 and rec.reached["command"] == 1


def test_jobs_that_never_arrive_are_lost_and_the_run_is_not_complete() -> None:
    rec = Recorder("r", final="running", clock=Clock())
    for i in range(3):
        rec.submitted(f"r-{i}", 0)
    rec.observe("placed", "r-0", MS)
    rec.observe("placed", "r-1", MS)
    rec.observe("command", "r-0", MS)
    rec.observe("running", "r-0", MS)
    assert rec.lost() == {"placed": 1, "command": 2, "running": 2}  # exit is not awaited in this run
    assert set(rec.timelines) == {"r-1", "r-2"}  # r-0 finished: its timeline is dropped (flat memory)


def test_a_job_seen_at_every_watched_stage_is_done_though_skipped_stages_never_came() -> None:
    rec = Recorder("r", skip=frozenset({"placed", "running"}), clock=Clock())
    rec.submitted("r-0", 10 * MS)
    rec.submitted("r-1", 10 * MS)
    rec.observe("placed", "r-0", 12 * MS)  # not watched: neither counted nor measured
    rec.observe("command", "r-0", 15 * MS)
    rec.observe("exit", "r-0", 40 * MS)
    rec.observe("command", "r-1", 16 * MS)
    assert rec.watched == ("command", "exit")
    assert set(rec.timelines) == {"r-1"}  # r-0 is complete without placed and running
    assert rec.lost() == {"command": 0, "exit": 1} and rec.reached["placed"] == 0
    lat = rec.latencies()
    assert lat["submit→command"].count == 2 and lat["submit→placed"].count == 0


def test_the_final_stage_or_an_unknown_one_cannot_be_skipped() -> None:
    with pytest.raises(ValueError, match="other than the final one"):
        Recorder("r", final="command", skip=frozenset({"command"}))
    with pytest.raises(ValueError, match="skip must name stages"):
        Recorder("r", skip=frozenset({"submit"}))


def test_a_sighting_after_the_final_stage_is_a_duplicate_even_without_the_timeline() -> None:
    rec = Recorder("r", final="placed", clock=Clock())
    rec.submitted("r-0", 0)
    rec.observe("placed", "r-0", MS)
    rec.observe("placed", "r-0", 2 * MS)
    assert rec.duplicates["placed"] == 1 and not rec.errors


def test_other_runs_jobs_are_ignored_and_hops_seen_backwards_are_counted() -> None:
    rec = Recorder("r", clock=Clock())
    rec.submitted("r-0", 0)
    rec.observe("placed", "other-0", MS)
    rec.observe("command", "r-0", 5 * MS)
    rec.observe("placed", "r-0", 6 * MS)
    assert rec.foreign == 1 and rec.reordered == 1
    assert rec.latencies()["placed→command"].max <= 0.001  # clamped to the histogram's floor, not negative


def test_wire_messages_are_routed_by_subject_and_kind() -> None:
    clock = Clock()
    rec = Recorder("r", Subjects("ns"), clock=clock)
    rec.submitted("r-1", 0)
    clock.now = 2 * MS
    rec.on_message("ns.sched.placed", wire(job_id="r-1"))
    clock.now = 3 * MS
    rec.on_message("ns.cmd.node-a", wire(kind="destroy_idle", node="node-a"))  # no job: ignored
    rec.on_message("ns.cmd.node-a", wire(kind="stop", job_id="r-1"))  # not a placement: ignored
    rec.on_message("ns.cmd.node-a", wire(kind="place", job_id="r-1"))
    clock.now = 5 * MS
    rec.on_message("ns.node.node-a.report", wire(kind="cmd_done", command="stop", job_id="r-1"))  # not a start
    rec.on_message("ns.node.node-a.heartbeat", wire(running=["r-1"]))
    assert rec.reached["running"] == 0
    rec.on_message("ns.node.node-a.report", wire(kind="cmd_done", command="place", job_id="r-1"))
    clock.now = 6 * MS
    rec.on_message("ns.node.node-a.report", wire(kind="job_started", job_id="r-1"))  # an older executor's
    clock.now = 9 * MS
    rec.on_message("ns.jobs.exit", wire(kind="completed", job_id="r-1"))
    rec.on_message("ns.dlq.jobs.submit", b"garbage", {"Migsched-Error": "malformed JSON"})
    rec.on_message("ns.sched.placed", b"{not json")
    assert dict(rec.reached) == {"placed": 1, "command": 1, "running": 1, "exit": 1}
    assert rec.latencies()["submit→command"].p50 == pytest.approx(3.0, rel=1e-3)
    assert rec.exit_kinds == {"completed": 1}
    assert rec.errors == {"dead-lettered: malformed JSON": 1, "undecodable placed": 1}
    assert rec.latencies()["command→running"].p50 == pytest.approx(2.0, rel=1e-3) and not rec.duplicates


async def test_waiting_for_completion_ends_when_the_last_job_has_every_stage_up_to_the_final_one() -> None:
    rec = Recorder("r", final="command", clock=Clock())
    rec.submitted("r-0", 0)
    assert await rec.wait_complete(0.01) is False
    rec.observe("command", "r-0", MS)
    assert await rec.wait_complete(0.01) is False  # its placement has not been seen yet
    rec.observe("placed", "r-0", 2 * MS)
    assert await rec.wait_complete(0.01) is True


def test_summaries_are_in_milliseconds_within_hdr_precision() -> None:
    h = new_histogram()
    for us in range(1, 10_001):  # 1 µs .. 10 ms uniformly
        h.record_value(us)
    s = summarize(h)
    assert s.count == 10_000
    assert s.p50 == pytest.approx(5.0, rel=0.002) and s.p99 == pytest.approx(9.9, rel=0.002)
    assert s.max == pytest.approx(10.0, rel=0.002)
    assert summarize(new_histogram()).count == 0


def test_throughput_is_the_rate_between_first_and_last_event() -> None:
    rec = Recorder("r", final="placed", clock=Clock())
    for i in range(101):
        rec.submitted(f"r-{i}", i * 10 * MS)  # 100/s for 1 s
        rec.observe("placed", f"r-{i}", i * 10 * MS + 5 * MS)
    assert rec.throughput()["placed"][0] == pytest.approx(100.0)
    assert rec.throughput()["submit"][1] == 100


def test_a_job_is_done_only_when_every_stage_up_to_the_final_one_was_seen() -> None:
    rec = Recorder("r", final="exit", clock=Clock())
    rec.submitted("r-0", 0)
    for stage, t in (("placed", 1), ("command", 2), ("exit", 3)):  # the exit overtook the start report
        rec.observe(stage, "r-0", t * MS)
    assert "r-0" in rec.timelines and rec.lost()["running"] == 1
    rec.observe("running", "r-0", 4 * MS)
    assert not rec.timelines and rec.lost() == dict.fromkeys(("placed", "command", "running", "exit"), 0)
    assert not rec.duplicates


def test_stages_after_the_final_one_are_not_accounted() -> None:
    rec = Recorder("r", final="command", clock=Clock())
    rec.submitted("r-0", 0)
    rec.observe("running", "r-0", MS)
    rec.observe("exit", "r-0", MS)
    assert rec.reached["running"] == 0 and rec.reached["exit"] == 0 and "r-0" in rec.timelines


def test_timelines_are_grouped_by_submit_window_with_their_latencies_sorted() -> None:
    from load.timelines import windows

    done = {
        "a": {"submit": 0, "command": 5 * MS},
        "b": {"submit": 100 * MS, "command": 102 * MS},
        "c": {"submit": 600 * MS, "command": 650 * MS},
        "d": {"submit": 700 * MS},  # never commanded: not in any window
    }
    rows = windows(done, "submit", "command", 0.5)
    assert rows == [(0.0, [2.0, 5.0]), (0.5, [50.0])]
