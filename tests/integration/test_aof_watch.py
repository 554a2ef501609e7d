"""``load.aof_watch``: a load run says when Redis rewrote its AOF, read from a real private redis-server."""

from __future__ import annotations

import math
import os
import time

import pytest
import redis

from load.aof_watch import AofWatch
from load.bench_pipeline import cpu_seconds
from shared.localservers import start_redis

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_a_rewrite_during_the_watch_is_reported_with_its_start_and_length() -> None:
    server = start_redis(appendonly=True)
    assert server.proc is not None
    r = redis.Redis.from_url(server.url)
    try:
        r.mset({f"k{i}": "x" * 100 for i in range(20_000)})  # something for the child to write
        watch = AofWatch(server.url, server.proc.pid, every_s=0.01)
        watch.start()
        time.sleep(0.05)
        r.bgrewriteaof()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (
            r.info("persistence")["aof_rewrite_in_progress"] or r.info("persistence")["aof_rewrites"] == 0
        ):
            time.sleep(0.01)
        time.sleep(0.05)
        watch.stop()
    finally:
        r.close()
        server.stop()
    assert len(watch.rewrites) == 1, watch.rewrites
    w = watch.rewrites[0]
    assert w.end_s is not None and 0.0 < w.start_s <= w.end_s
    assert "redis AOF rewrites while the scenario ran: 1" in watch.summary()
    assert "began at" in watch.summary()
    # the first poll samples the memory, with the 20,000 keys in it
    assert watch.memory and watch.memory[0][1] > 20_000 * 100
    assert watch.memory_summary().startswith("redis used_memory (MiB) every 30 s from the start: ")


def test_polls_open_and_close_rewrites_in_turn_and_a_running_one_stays_open() -> None:
    watch = AofWatch("redis://unused")
    for answer in (False, True, True, False, False, True):
        watch.observe(answer)
    assert len(watch.rewrites) == 2
    assert watch.rewrites[0].end_s is not None and watch.rewrites[1].end_s is None
    assert "(running)" in watch.summary()


def test_memory_is_sampled_once_per_interval_and_listed_in_mib() -> None:
    watch = AofWatch("redis://unused", memory_every_s=3600.0)
    assert watch.memory_summary() == "redis used_memory: not sampled"
    assert watch.memory_due()
    watch.observe_memory(5 * 2**20)
    assert not watch.memory_due()  # the next sample is an hour away
    watch.observe_memory(7 * 2**20)
    assert watch.memory_summary() == "redis used_memory (MiB) every 3600 s from the start: 5, 7"


def test_children_cpu_is_read_for_a_live_process_and_is_not_a_number_for_a_missing_one() -> None:
    assert cpu_seconds(os.getpid(), children=True) >= 0.0
    assert math.isnan(cpu_seconds(2**22 + 12345, children=True))
