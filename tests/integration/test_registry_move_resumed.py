"""A move whose target copy started but whose ``migrate_start`` answer never reached the node registry (a consumer
skipped it) is resumed once the target node has listed the copy for a command time-out: the source gets its
``migrate_stop``, whose answer commits the move (real NATS and Redis)."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings
from shared.events import Command
from shared.mig.geometry import default_geometry
from shared.state import audit
from tests.integration.test_registry_flow import until
from tests.integration.test_registry_move_exits import _moving_across

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
GEO = default_geometry()
CMD_TIMEOUT_S = 2.0


async def test_a_move_whose_start_answer_was_lost_is_resumed_and_commits(prefix: str, nats_url: str,
                                                                         redis_url: str) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, node_timeout_s=600.0, cmd_timeout_s=CMD_TIMEOUT_S)
        await stack.start()
        n1 = ScriptedExecutor(ns.bus, "n1", gpus=1)
        n2 = ScriptedExecutor(ns.bus, "n2", gpus=1, auto_ack=False)
        try:
            src, dst = await _moving_across(ns, n1, n2)
            # n2 started the job's copy on the target, and its cmd_done never reached the registry
            start = "mig:j1:m1:start"
            n2.running["j1"] = Command(id=start, cmd_id=start, kind="migrate_start", node="n2", gpu_id="n2/0",
                                       gpu_index=0, instance_id=dst.id, src_instance_id=src, job_id="j1",
                                       at=time.time())

            async def beat_until_stopped() -> bool:
                for _ in range(int(8 * CMD_TIMEOUT_S / 0.25)):
                    if n1.commands("migrate_stop"):
                        return True
                    await n1.heartbeat()
                    await n2.heartbeat()
                    await asyncio.sleep(0.25)
                return False

            assert await beat_until_stopped()
            [stop] = n1.commands("migrate_stop")
            assert (stop.job_id, stop.src_instance_id, stop.instance_id) == ("j1", src, dst.id)

            async def committed() -> bool:
                job = await ns.state.job("j1")
                return job is not None and (job.state, job.inst) == ("running", dst.id)

            assert await until(committed)  # n1 answered the migrate_stop
            assert await audit(ns.state, GEO) == []
        finally:
            await n1.stop()
            await n2.stop()
            await stack.stop()
