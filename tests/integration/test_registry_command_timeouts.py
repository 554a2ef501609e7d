"""A command's time-out does not count a bus outage: while NATS is down, or back for less than
``cmd_timeout_s``, a command without a result may still be queued in the stream, and failing its placement
would let the executor run the job twice. Real NATS (a private server the test stops) and Redis; the sweep is
called by the test, every wait is a condition, and the clocks that matter are moved explicitly."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common.testing import Namespace, ScriptedExecutor, Stack
from shared.events import Demand, JobSubmit, now
from shared.localservers import LocalServer, free_port, start_nats
from shared.settings import Settings, load
from tests.integration.test_registry_liveness import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# Far longer than the test: the periodic sweep never runs on its own, the test calls it when it wants to.
TIMEOUT = 600.0


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[LocalServer]:
    srv = start_nats(free_port(), tmp_path / "nats")
    yield srv
    srv.stop()


async def test_a_command_queued_across_a_bus_outage_is_not_timed_out(
    private_nats: LocalServer, redis_url: str, prefix: str
) -> None:
    url = private_nats.url
    settings = load(
        Settings, namespace=prefix, nats_url=url, redis_url=redis_url, stream_storage="file", metrics_port=0
    )
    async with Namespace(settings) as ns:
        stack = Stack(
            prefix, url, redis_url, node_timeout_s=TIMEOUT, cmd_timeout_s=TIMEOUT, stream_storage="file"
        )
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=1, auto_ack=False)  # the command never gets a result
        await ex.start()
        part = stack.registry
        cmds_key = ns.state.keys(0).cmds

        async def placing_cmds() -> dict[str, dict[str, object]]:
            return {c: i for c, i in (await ns.state.commands(0)).items() if i.get("kind") == "place"}

        async def sent_long_ago() -> str:
            """Make the command as old as an outage that lasted ten time-outs; returns its id."""
            (cid, info), = (await placing_cmds()).items()
            await ns.state.redis.hset(cmds_key, cid, json.dumps({**info, "at": time.time() - 10 * TIMEOUT}))
            return cid

        async def job_state() -> str:
            rec = await ns.state.job("j1")
            return rec.state if rec else ""

        try:
            assert await until(lambda: len(stack.balancer.mirrors[0]) >= 1)
            await ns.bus.publish(
                ns.bus.subjects.jobs_submit,
                JobSubmit(id="s-j1", job_id="j1", demand=Demand(kind="mig", profile="1g.5gb"), submitted_at=now()),
            )
            assert await until(lambda: len(ex.commands("place")) == 1)
            assert await until(placing_cmds)

            # NATS goes down with the command unanswered
            assert private_nats.proc is not None
            private_nats.proc.terminate()
            private_nats.proc.wait(10)
            assert await until(lambda: not part.bus.health.connected)
            cid = await sent_long_ago()
            await part.nodes.sweep_commands()
            assert cid in await placing_cmds(), "a command was timed out while the registry's bus was down"
            assert await job_state() == "placing"

            # NATS is back: the command's wait counts from the reconnect, not from when it was sent
            private_nats.restart()
            assert await until(lambda: part.bus.health.connected)
            await part.nodes.sweep_commands()
            assert cid in await placing_cmds(), "a command was timed out right after the bus came back"
            assert await job_state() == "placing"
            rec = await ns.state.job("j1")
            assert rec is not None and rec.attempts == 0

            # the rule can fire: once the bus has been back for the time-out, the command is late
            watch = part.nodes.watch
            part.bus.health.since -= 2 * TIMEOUT
            watch.back_at -= 2 * TIMEOUT
            watch.heard_at = time.monotonic()
            await part.nodes.sweep_commands()
            assert cid not in await placing_cmds()
            rec = await ns.state.job("j1")
            assert rec is not None and rec.attempts == 1
            assert any(f"no result for {cid}" in h.reason for h in await ns.state.history("j1"))
        finally:
            await ex.stop()
            await stack.stop()
