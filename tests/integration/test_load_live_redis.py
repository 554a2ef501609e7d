"""``load.live``'s account of Redis after a run, read from a real Redis: its round trips and where its CPU went."""

from __future__ import annotations

import re

import pytest
import redis

from load.live import redis_pauses

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


def test_the_run_summary_gives_redis_round_trips_and_cpu_per_command(redis_url: str, prefix: str) -> None:
    r = redis.Redis.from_url(redis_url)
    try:
        for i in range(5):
            r.set(f"{prefix}:k{i}", i)
        out = redis_pauses(redis_url)
    finally:
        r.delete(*(f"{prefix}:k{i}" for i in range(5)))
        r.close()
    trips = re.search(r"redis round trips \(read events\) (\d+), commands (\d+)", out)
    assert trips is not None and int(trips.group(1)) >= 5 and int(trips.group(2)) >= 5
    per_command = re.findall(r"redis (\S+) +(\d+) calls, +[\d.]+ s, +[\d.]+ µs each", out)
    assert 1 <= len(per_command) <= 6 and all(int(calls) > 0 for _, calls in per_command)
