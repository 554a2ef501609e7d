"""A cancelled job whose stop never reached its node is stopped again once a command time-out has passed with
the node still listing it in its heartbeats (real NATS and Redis)."""

from __future__ import annotations

import asyncio

import pytest

from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings, until
from shared.events import Demand, JobCancel, JobSubmit, now

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
CMD_TIMEOUT_S = 2.0


async def test_a_cancelled_job_whose_stop_was_lost_is_stopped_again(prefix: str, nats_url: str,
                                                                     redis_url: str) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, cmd_timeout_s=CMD_TIMEOUT_S)
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=1)
        await ex.start()
        try:
            assert await until(lambda: _mirror_ready(stack), 10)
            await ns.bus.publish(ns.bus.subjects.jobs_submit, JobSubmit(
                id="s-j1", job_id="j1", demand=Demand(kind="mig", profile="1g.5gb"), submitted_at=now()))
            assert await until(lambda: _state(ns, "running"), 10)
            ex.lose_stop.add("j1")
            await ns.bus.publish(ns.bus.subjects.jobs_cancel, JobCancel(id="c-j1", job_id="j1", at=now()))
            assert await until(lambda: _flagged(ns), 10)

            async def beat_until_stopped() -> bool:
                for _ in range(int(8 * CMD_TIMEOUT_S / 0.25)):
                    if ex.commands("stop"):
                        return True
                    await ex.heartbeat()
                    await asyncio.sleep(0.25)
                return False

            assert not ex.lose_stop  # the cancel's own stop was sent, and lost
            assert await beat_until_stopped()
            [stop] = ex.commands("stop")
            assert stop.cmd_id.startswith("stop:j1:stray:n1:")
            assert await until(lambda: _state(ns, "cancelled"), 10)
        finally:
            await ex.stop()
            await stack.stop()


async def _mirror_ready(stack: Stack) -> bool:
    return len(stack.balancer.mirrors[0]) >= 1


async def _state(ns: Namespace, state: str) -> bool:
    j = await ns.state.job("j1")
    return j is not None and j.state == state


async def _flagged(ns: Namespace) -> bool:
    j = await ns.state.job("j1")
    return j is not None and j.cancel
