"""An exit report the registry's consumer never delivered, on real NATS and Redis: the node's heartbeat repeats
it, and once a later report of the node has come (the consumer went past it) the registry applies it as the
report would have been applied. A repeated report it applied already, or one of a run an earlier placement
started, changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from services.common.testing import Namespace, ScriptedExecutor, Stack, Watch, make_settings
from shared.events import Drift, Heartbeat, JobExit, JobExited, ToldExit, new_id
from shared.state import audit
from tests.integration.test_registry_earlier_exits import GEO, IID, NEVER, _exit, _placed
from tests.integration.test_registry_flow import is_, until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def _heartbeat(ns: Namespace, *exits: JobExited) -> None:
    await ns.bus.publish(
        ns.bus.subjects.node_heartbeat("n1"),
        Heartbeat(id=new_id("hb"), node="n1", seq=1, at=time.time(), exits=tuple(ToldExit.of(e) for e in exits)),
    )


async def _went_past(ns: Namespace, e: JobExited) -> None:
    """A report n1 sent after ``e`` reaches the registry: its consumer went past ``e``."""
    await ns.bus.publish(ns.bus.subjects.node_report("n1"),
                         Drift(id=new_id("drift"), node="n1", at=e.at + 1.0, details=("later",)))
    await asyncio.sleep(0.3)


@contextlib.asynccontextmanager
async def _registry(prefix: str, nats_url: str, redis_url: str) -> AsyncIterator[tuple[Namespace, Watch[JobExit]]]:
    """The registry (the balancer stopped: placements are made here), node n1 with one GPU, and a watch of
    ``jobs.exit``."""
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, node_timeout_s=NEVER, cmd_timeout_s=NEVER)
        await stack.start()
        watch = await ns.watch_exits()
        try:
            n1 = ScriptedExecutor(ns.bus, "n1", gpus=1, auto_ack=False)
            await n1.start()
            assert await until(lambda: len(stack.balancer.mirrors[0]) >= 1)
            await n1.stop()
            await stack.balancer.stop()
            stack.services.remove(stack.balancer)
            yield ns, watch
            assert await audit(ns.state, GEO) == []
        finally:
            await watch.close()
            await stack.stop()


async def test_an_exit_whose_report_never_arrived_ends_the_job_from_the_heartbeat_that_repeats_it(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with _registry(prefix, nats_url, redis_url) as (ns, watch):
        attempt = await _placed(ns, "create")
        await _heartbeat(ns)  # a heartbeat that lists nothing ends nothing
        await asyncio.sleep(0.3)
        assert (await ns.state.job("j1")).state == "running"  # type: ignore[union-attr]
        lost = _exit("completed", f"place:j1:{attempt}")  # published by the node, skipped by the consumer
        await _heartbeat(ns, lost)
        await asyncio.sleep(0.3)  # its report may only be late: it waits
        assert (await ns.state.job("j1")).state == "running"  # type: ignore[union-attr]
        await _went_past(ns, lost)
        await _heartbeat(ns, lost)
        assert await until(is_(ns, "j1", "finished"))
        assert [(e.job_id, e.kind, e.instance_id) for e in watch.seen] == [("j1", "completed", IID)]
        # the report shows up after all, and the heartbeats go on listing it: nothing more happens (the exit
        # may go out again under its id, which the stream drops)
        await ns.bus.publish(ns.bus.subjects.node_report("n1"), lost)
        await _heartbeat(ns, lost)
        await asyncio.sleep(0.3)
        assert {e.id for e in watch.seen} == {f"exit:j1:{IID}"}
        assert [h.to for h in await ns.state.history("j1")].count("finished") == 1


async def test_a_repeated_exit_the_registry_applied_or_of_an_earlier_run_changes_nothing(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with _registry(prefix, nats_url, redis_url) as (ns, watch):
        first = await _placed(ns, "create")
        assert (await ns.state.release("j1", "lost", "node resync", time.time())).state == "pending"
        second = await _placed(ns, "reuse")
        # the first run's exit, which the registry never received, comes in a heartbeat after the second
        # run started on the same instance: it names the first run's place command
        earlier = _exit("cancelled", f"place:j1:{first}")
        await _heartbeat(ns, earlier)
        await _went_past(ns, earlier)
        await _heartbeat(ns)
        await asyncio.sleep(0.5)
        assert (await ns.state.job("j1")).state == "running"  # type: ignore[union-attr]
        assert watch.seen == []
        done = _exit("failed", f"place:j1:{second}")
        await ns.bus.publish(ns.bus.subjects.node_report("n1"), done)
        assert await until(is_(ns, "j1", "failed"))
        await _heartbeat(ns, done)  # applied already: passed over
        await asyncio.sleep(0.3)
        assert [(e.job_id, e.kind) for e in watch.seen] == [("j1", "failed")]
        assert "cancelled" not in [h.to for h in await ns.state.history("j1")]
