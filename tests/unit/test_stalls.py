"""A service's pauses (event-loop stalls, garbage collections) are measured, and the long ones logged in a form
``load.live`` reads back."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from load.live import pauses
from services.common import stalls
from services.common.runner import watched

pytestmark = pytest.mark.unit


def ticking(*instants: float) -> Callable[[], float]:
    """A clock that returns these instants in turn, then the last one forever."""
    it: Iterator[float] = iter(instants)
    last = [instants[-1]]

    def clock() -> float:
        last[0] = next(it, last[0])
        return last[0]

    return clock


def count(metric: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(f"{metric}_count", labels) or 0.0


def test_a_long_full_collection_is_logged_with_its_generation_and_instant(caplog: pytest.LogCaptureFixture) -> None:
    before = count("migsched_gc_pause_seconds", service="t-gc-long", generation="2")
    timer = stalls.GcPauses("t-gc-long", clock=ticking(100.0, 100.035))
    with caplog.at_level(logging.WARNING, logger="migsched.stalls"):
        timer("start", {"generation": 2})
        timer("stop", {"generation": 2, "collected": 7})
    hits = [h for r in caplog.records if (h := stalls.parse(r.getMessage())) is not None]
    assert hits == [("t-gc-long", "gc2", 35.0, 100.035)]
    assert count("migsched_gc_pause_seconds", service="t-gc-long", generation="2") == before + 1


def test_a_short_collection_is_counted_but_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    timer = stalls.GcPauses("t-gc-short", clock=ticking(5.0, 5.001))
    with caplog.at_level(logging.WARNING, logger="migsched.stalls"):
        timer("start", {"generation": 0})
        timer("stop", {"generation": 0, "collected": 0})
    assert not [r for r in caplog.records if stalls.parse(r.getMessage())]
    assert count("migsched_gc_pause_seconds", service="t-gc-short", generation="0") == 1


def test_installing_twice_registers_the_timer_once_and_uninstalling_removes_it() -> None:
    timer = stalls.GcPauses("t-install")
    timer.install()
    timer.install()
    try:
        assert sum(cb is timer for cb in gc.callbacks) == 1
    finally:
        timer.uninstall()
    assert timer not in gc.callbacks


def test_a_loop_woken_late_reports_the_lateness_as_a_stall(caplog: pytest.LogCaptureFixture) -> None:
    # asked at 10.0 + 0.01, woken at 10.5: 490 ms late; the third reading ends the test by cancelling
    async def scenario() -> None:
        watch = asyncio.create_task(stalls.watch_loop("t-loop", interval_s=0.01, clock=ticking(10.0, 10.5)))
        while not any(stalls.parse(r.getMessage()) for r in caplog.records):
            await asyncio.sleep(0.005)
        watch.cancel()

    with caplog.at_level(logging.WARNING, logger="migsched.stalls"):
        asyncio.run(scenario())
    hits = [h for r in caplog.records if (h := stalls.parse(r.getMessage())) is not None]
    assert hits[0] == ("t-loop", "loop", 490.0, 10.5)
    assert count("migsched_loop_stall_seconds", service="t-loop") >= 1


def test_lines_that_are_not_stalls_or_are_garbled_parse_to_nothing() -> None:
    assert stalls.parse("2026-11-30 WARNING migsched.balancer queue deep") is None
    assert stalls.parse("stall service=x kind=loop ms=abc mono=1") is None
    assert stalls.parse("stall service=x kind=loop") is None
    line = "2026-11-30 07:00:00 WARNING migsched.stalls " + stalls.describe("balancer", "gc2", 0.0512, 77.25)
    assert stalls.parse(line) == ("balancer", "gc2", 51.2, 77.25)


def test_the_watch_ends_with_the_service_it_watches() -> None:
    async def scenario() -> set[asyncio.Task[object]]:
        async def service() -> None:
            await asyncio.sleep(0.01)

        await watched("t-ends", service)
        await asyncio.sleep(0)
        return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}

    assert asyncio.run(scenario()) == set()


def test_a_load_run_summarises_the_pauses_its_services_logged(tmp_path: Path) -> None:
    (tmp_path / "balancer.log").write_text(
        "2026-11-30 WARNING migsched.stalls " + stalls.describe("balancer", "gc2", 0.060, 12.0) + " collected=3\n"
        "2026-11-30 WARNING migsched.balancer something else\n"
        "2026-11-30 WARNING migsched.stalls " + stalls.describe("balancer", "gc2", 0.020, 13.0) + "\n")
    (tmp_path / "registry.log").write_text(
        "2026-11-30 WARNING migsched.stalls " + stalls.describe("registry", "loop", 0.110, 14.5) + "\n")
    text = pauses(tmp_path)
    assert "balancer               gc2       2 x, max    60.0 ms, sum     80.0 ms" in text
    assert "registry               loop      1 x, max   110.0 ms" in text
    longest = text.split("longest:")[1].splitlines()
    assert "14.500" in longest[1] and "registry" in longest[1]


def test_a_load_run_without_pauses_says_so(tmp_path: Path) -> None:
    (tmp_path / "balancer.log").write_text("nothing to see\n")
    assert pauses(tmp_path).startswith("pauses: none")

