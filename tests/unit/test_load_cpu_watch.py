"""``load.cpu_watch``: per-window CPU of each process of a load run, and how busy the machine was."""

from __future__ import annotations

import math
import os

import pytest

from load.cpu_watch import CpuWatch, run_queue_seconds

pytestmark = pytest.mark.unit


def test_each_window_holds_the_cpu_spent_in_it_not_since_the_start() -> None:
    readings = iter([(0.0, {"balancer": 10.0, "redis": 5.0}), (8.0, {"balancer": 13.0, "redis": 6.0}),
                     (20.0, {"balancer": 17.5, "redis": 6.5})])
    watch = CpuWatch({"balancer": 1, "redis": 2}, every_s=10, cores=2)
    busy0, cpu0 = next(readings)
    watch._last = (0.0, busy0, cpu0, {})
    for at, (busy, cpu) in zip((10.0, 20.0), readings, strict=True):
        watch.observe(at, busy, cpu, {})

    assert [(w.start_s, w.length_s) for w in watch.windows] == [(0.0, 10.0), (10.0, 10.0)]
    assert watch.windows[0].cpu_s == {"balancer": 3.0, "redis": 1.0}
    assert watch.windows[1].cpu_s == {"balancer": 4.5, "redis": 0.5}
    assert [w.busy_pct for w in watch.windows] == [40.0, 60.0]  # 8 of 20 core-seconds, then 12 of 20


def test_a_process_that_has_gone_shows_as_a_dash_not_a_negative_figure() -> None:
    watch = CpuWatch({"harness": 1, "balancer": 2}, every_s=10, cores=1)
    watch._last = (0.0, 0.0, {"harness": 1.0, "balancer": 1.0}, {})
    watch.observe(10.0, 5.0, {"harness": math.nan, "balancer": 3.0}, {})

    rows = watch.table().splitlines()
    assert rows[0] == "| from (s) | machine busy % | balancer | harness |"
    assert rows[2] == "| 0 | 50.0 | 2.00 | - |"


def test_a_sample_at_the_same_instant_opens_no_empty_window() -> None:
    watch = CpuWatch({"x": 1}, cores=1)
    watch._last = (5.0, 1.0, {"x": 1.0}, {})
    watch.observe(5.0, 1.0, {"x": 1.0}, {})
    assert watch.windows == []


def test_the_wait_table_holds_each_window_s_run_queue_seconds_beside_the_cpu_table() -> None:
    watch = CpuWatch({"balancer": 1}, cores=2)
    watch._last = (0.0, 0.0, {"balancer": 1.0}, {"balancer": 0.5})
    watch.observe(10.0, 10.0, {"balancer": 4.0}, {"balancer": 2.0})
    watch.observe(20.0, 18.0, {"balancer": 6.0}, {"balancer": 2.25})

    assert [w.wait_s for w in watch.windows] == [{"balancer": 1.5}, {"balancer": 0.25}]
    assert watch.table("wait").splitlines()[2:] == ["| 0 | 50.0 | 1.50 |", "| 10 | 40.0 | 0.25 |"]
    assert watch.table("cpu").splitlines()[2:] == ["| 0 | 50.0 | 3.00 |", "| 10 | 40.0 | 2.00 |"]


def test_run_queue_seconds_of_a_live_process_is_a_figure_and_of_a_gone_one_nan() -> None:
    assert run_queue_seconds(os.getpid()) >= 0.0
    assert math.isnan(run_queue_seconds(2**22 + 12345))  # above the largest pid Linux allows (2**22)


def test_a_real_watch_sees_this_process_burn_cpu_and_closes_its_last_window_on_stop() -> None:
    watch = CpuWatch({"me": os.getpid()}, every_s=0.05)
    watch.start()
    spent, x = 0.0, 0
    start = os.times()
    while spent < 0.3:  # CPU, not wall time: the watch must see it whatever else the machine runs
        x += sum(range(10_000))
        t = os.times()
        spent = (t.user + t.system) - (start.user + start.system)
    watch.stop()

    assert watch.windows, "no window closed"
    assert all(w.wait_s["me"] >= 0.0 for w in watch.windows)
    assert math.fsum(w.cpu_s["me"] for w in watch.windows) > 0.2
    assert all(w.busy_pct >= 0.0 for w in watch.windows)
    ends = [w.start_s + w.length_s for w in watch.windows]
    assert ends == sorted(ends) and [w.start_s for w in watch.windows[1:]] == ends[:-1]
