"""The node registry does not call a node lost for silence that was its own: a NATS restart
stops every heartbeat, and the nodes must come out of it up, their jobs still running. Real NATS (a private
server, so that the test can stop it) and Redis; every wait is a condition, nothing depends on how long the
outage lasts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.common.testing import Namespace, ScriptedExecutor, Stack
from services.common.testing import until as wait_for
from shared.events import Demand, JobSubmit, now
from shared.localservers import LocalServer, free_port, start_nats
from shared.settings import Settings, load

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# Far longer than the test: the periodic check never runs on its own, the test calls it when it wants to.
TIMEOUT = 600.0


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[LocalServer]:
    srv = start_nats(free_port(), tmp_path / "nats")
    yield srv
    srv.stop()



async def until(pred: Any, timeout: float = 15.0) -> bool:
    return await wait_for(pred, timeout)


async def test_a_node_silent_only_while_the_bus_was_down_is_not_lost(
    private_nats: LocalServer, redis_url: str, prefix: str
) -> None:
    url = private_nats.url
    # file storage: the streams and consumers must outlive the server restart, as in production
    settings = load(
        Settings, namespace=prefix, nats_url=url, redis_url=redis_url, stream_storage="file", metrics_port=0
    )
    async with Namespace(settings) as ns:
        stack = Stack(prefix, url, redis_url, node_timeout_s=TIMEOUT, stream_storage="file")
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=1)
        await ex.start()
        part = stack.registry
        try:
            assert await until(lambda: len(stack.balancer.mirrors[0]) >= 1)
            await ns.bus.publish(
                ns.bus.subjects.jobs_submit,
                JobSubmit(id="s-j1", job_id="j1", demand=Demand(kind="mig", profile="1g.5gb"), submitted_at=now()),
            )

            async def state_of(job: str) -> str:
                rec = await ns.state.job(job)
                return rec.state if rec else ""

            async def node() -> str:
                return (await ns.state.nodes())["n1"]["state"]

            assert await until(lambda: _eq(state_of("j1"), "running"))

            # NATS goes down; the node's last heartbeat is long past (as if the outage had lasted that long)
            assert private_nats.proc is not None
            private_nats.proc.terminate()
            private_nats.proc.wait(10)
            assert await until(lambda: not part.bus.health.connected)
            await ns.state.heartbeat([("n1", time.time() - 10 * TIMEOUT)])
            await part.nodes.check_liveness()
            assert await node() == "up", "a node was declared lost while the registry's bus was down"

            # NATS is back: every node gets a fresh node_timeout_s to be heard again
            private_nats.restart()
            assert await until(lambda: part.bus.health.connected)
            await part.nodes.check_liveness()
            assert await node() == "up", "a node was declared lost right after the bus came back"
            assert await state_of("j1") == "running"

            # the heartbeat consumer hears the node again after the restart (its pull requests are renewed)
            await ex.heartbeat()
            assert await until(
                lambda: _gt(_last_seen(ns), time.time() - TIMEOUT), timeout=30
            ), "no heartbeat was consumed after the NATS restart"

            # the rule can fire: once the grace is over, a node that stays silent is lost
            await ns.state.heartbeat([("n1", time.time() - 10 * TIMEOUT)])
            watch = part.nodes.watch
            part.bus.health.since -= 10 * TIMEOUT
            watch.back_at -= 10 * TIMEOUT
            watch.heard_at -= 10 * TIMEOUT
            await part.nodes.check_liveness()
            assert await node() == "lost"
            assert await state_of("j1") == "pending"
        finally:
            await ex.stop()
            await stack.stop()


async def _last_seen(ns: Namespace) -> float:
    return float((await ns.state.nodes())["n1"].get("last_seen", "0"))


async def _eq(v, want: str) -> bool:  # type: ignore[no-untyped-def]
    return (await v) == want


async def _gt(v, than: float) -> bool:  # type: ignore[no-untyped-def]
    return (await v) > than
