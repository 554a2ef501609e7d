"""What an executor's heartbeats repeat of its exit reports: each one from a second to ten seconds after it went
out, the newest 64 at most, so that the registry can apply one its consumer never delivered."""

from __future__ import annotations

import pytest

from services.executor.exits import TOLD_AFTER_S, TOLD_FOR_S, TOLD_MAX, ExitReports
from shared.bus import MemoryBus
from shared.events import JobExited
from shared.settings import Settings, load

pytestmark = pytest.mark.unit


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _reports(clock: _Clock) -> ExitReports:
    bus = MemoryBus(load(Settings, env={}, metrics_port=0))
    return ExitReports(bus, None, None, "n1", None, None, window_s=60.0, clock=clock)  # type: ignore[arg-type]


def _exit(job: str, reason: str = "done") -> JobExited:
    return JobExited(id=f"x-{job}", node="n1", at=1.0, job_id=job, gpu_index=0, instance_id="n1/0:1g.5gb@0:x",
                     exit="failed", status=3, reason=reason, started_by=f"place:{job}:2")


def test_an_exit_is_repeated_from_a_second_after_its_report_until_ten_seconds_after() -> None:
    clock = _Clock()
    ex = _reports(clock)
    ex.published(_exit("j1"))
    assert ex.told() == ()  # the report itself is still on its way
    clock.t += TOLD_AFTER_S
    (told,) = ex.told()
    assert told.report("n1") == _exit("j1")  # the report as it was published
    clock.t += TOLD_FOR_S - TOLD_AFTER_S - 0.01
    assert [e.job_id for e in ex.told()] == ["j1"]
    clock.t += 0.01
    assert ex.told() == ()


def test_a_heartbeat_repeats_the_newest_exits_oldest_first_with_their_reasons_cut_short() -> None:
    clock = _Clock()
    ex = _reports(clock)
    for i in range(TOLD_MAX + 5):
        ex.published(_exit(f"j{i}", reason="x" * 2000))
    clock.t += TOLD_AFTER_S
    told = ex.told()
    assert [e.job_id for e in told] == [f"j{i}" for i in range(5, TOLD_MAX + 5)]
    assert {len(e.reason) for e in told} == {256}
