"""The exit of a run an earlier placement started, through the registry on real NATS and Redis: a job re-queued
and placed again on the very instance it ran on (reused idle) is told apart from its earlier run only by the
command that started each, which every exit names. The earlier run's exit, reported late, ends nothing."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings
from shared.events import JobExited, new_id
from shared.mig.geometry import default_geometry
from shared.state import Reservation, StoredInstance, audit
from tests.integration.test_registry_flow import is_, until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
GEO = default_geometry()
P1 = GEO.model("A100-40GB").profile("1g.5gb")
NEVER = 600.0
IID = "n1/0:1g.5gb@0:j1"


async def _placed(ns: Namespace, action: str) -> int:
    """j1 reserved on ``IID`` and started there, as the registry records a place's ``cmd_done`` -> its attempt."""
    (g,) = await ns.state.get_gpus(["n1/0"])
    inst = StoredInstance(id=IID, profile=P1.name, start=0, size=P1.memory_slices, compute=P1.compute_slices)
    r = await ns.state.reserve(
        Reservation(job_id="j1", gpu_id="n1/0", expected_ver=g.ver, instance=inst, action=action,  # type: ignore[arg-type]
                    max_count=P1.max_count, spec=b""),
        time.time(),
    )
    assert r.ok, r
    attempt = int(r.detail)
    assert await ns.state.mark_running("j1", IID, time.time(), f"place:j1:{attempt}", attempt, "n1") == "ok"
    return attempt


def _exit(kind: str, started_by: str) -> JobExited:
    return JobExited(id=new_id("x"), node="n1", at=time.time(), job_id="j1", gpu_index=0, instance_id=IID,
                     exit=kind, started_by=started_by)  # type: ignore[arg-type]


async def test_an_earlier_runs_exit_on_the_instance_the_job_was_placed_on_again_ends_nothing(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, node_timeout_s=NEVER, cmd_timeout_s=NEVER)
        await stack.start()
        watch = await ns.watch_exits()
        n1 = ScriptedExecutor(ns.bus, "n1", gpus=1, auto_ack=False)
        try:
            await n1.start()

            async def ready() -> bool:
                return len(stack.balancer.mirrors[0]) >= 1

            assert await until(ready)
            # the placements are made here, not by the balancer
            await stack.balancer.stop()
            stack.services.remove(stack.balancer)
            first = await _placed(ns, "create")
            # the node lost touch: the job is re-queued and its run stopped; placed again, on the same instance
            assert (await ns.state.release("j1", "lost", "node resync", time.time())).state == "pending"
            second = await _placed(ns, "reuse")
            assert second > first
            # the first run's exit, held back on the node, arrives after the second run started
            await ns.bus.publish(ns.bus.subjects.node_report("n1"), _exit("cancelled", f"place:j1:{first}"))
            await ns.bus.publish(ns.bus.subjects.node_report("n1"), _exit("completed", f"place:j1:{second}"))
            assert await until(is_(ns, "j1", "finished"))
            await asyncio.sleep(0.3)  # time for a second exit to show, were one published
            assert [(e.job_id, e.kind) for e in watch.seen] == [("j1", "completed")]
            assert "cancelled" not in [h.to for h in await ns.state.history("j1")]
            assert await audit(ns.state, GEO) == []
        finally:
            await watch.close()
            await n1.stop()
            await stack.stop()
