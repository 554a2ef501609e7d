"""The probes each process serves: live while its loop turns, ready once started and while nothing is down, the
metrics beside them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.common.health import Probes, consumers_readiness

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def get(probes: Probes, path: str) -> tuple[str, bytes]:
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen["status"] = status

    body = b"".join(probes.app()({"PATH_INFO": path, "REQUEST_METHOD": "GET", "QUERY_STRING": ""},
                                 start_response))
    return seen["status"], body


def test_a_loop_that_stops_turning_is_not_live_and_so_not_ready() -> None:
    clock = Clock()
    probes = Probes(stale_after_s=30.0, clock=clock)
    probes.readiness = lambda: None
    assert get(probes, "/healthz") == ("200 OK", b"ok\n") and get(probes, "/readyz")[0] == "200 OK"
    clock.t += 31.0
    status, body = get(probes, "/healthz")
    assert status.startswith("503") and b"has not turned for 31 s" in body
    assert get(probes, "/readyz")[0].startswith("503")
    probes.tick()
    assert get(probes, "/healthz")[0] == "200 OK"


def test_until_the_service_says_otherwise_it_is_live_but_not_ready() -> None:
    probes = Probes(clock=Clock())
    assert get(probes, "/healthz")[0] == "200 OK"
    assert get(probes, "/readyz") == ("503 Service Unavailable", b"starting\n")


def test_any_other_path_is_the_metrics_exposition() -> None:
    status, body = get(Probes(clock=Clock()), "/metrics")
    assert status.startswith("200") and b"# TYPE" in body


class FakeConsumer:
    def __init__(self, durable: str) -> None:
        self.durable = durable
        self.pause_s = 0.0


async def test_a_service_is_ready_only_while_its_tasks_run_and_no_consumer_waits_out_an_outage() -> None:
    consumers = [FakeConsumer("balancer-submit"), FakeConsumer("balancer-cancel")]
    task = asyncio.create_task(asyncio.sleep(3600), name="balancer:backfill")
    tasks = [task]
    stopping = False
    def ready() -> str | None:
        return consumers_readiness(True, consumers, tasks, stopping)

    assert ready() is None
    consumers[1].pause_s = 0.5
    assert ready() == "waiting out an outage of Redis or the bus: balancer-cancel"
    consumers[1].pause_s = 0.0
    task.cancel()
    await asyncio.sleep(0)
    assert ready() == "task(s) ended: balancer:backfill"
    stopping = True
    assert ready() == "stopping"
    assert consumers_readiness(False, [], [], False) == "starting"
    assert consumers_readiness(True, [], [], False) is None  # none to run
