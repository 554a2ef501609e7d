"""A node that registers while running a job the state does not hold there (an executor restarted and
re-attached to its workloads): the instance is never adopted idle; the registry stops the job, and
the instance is reusable once the node confirms. Real NATS and Redis, the in-process stack."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings
from shared.events import GpuReport, InstanceReport, Registered, new_id
from shared.mig.geometry import default_geometry
from shared.state import audit
from tests.integration.test_registry_flow import is_, submit, until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(40)]
GEO = default_geometry()
IID = "n1/0:7g.40gb@0:old"


async def test_an_instance_running_an_unknown_job_is_held_stopped_then_reused(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url)
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=1, auto_ack=False)  # answers only when the test says so
        try:
            await ex._consumer.start()
            task = asyncio.create_task(ex._consumer.run())
            p = GEO.model("A100-40GB").profile("7g.40gb")
            found = InstanceReport(instance_id=IID, gi_id=1, profile=p.name, profile_id=p.profile_id, start=0,
                                   size=p.memory_slices, job_id="ghost")
            await ns.bus.publish(
                ns.bus.subjects.node_report("n1"),
                Registered(id=new_id("reg"), node="n1", at=time.time(),
                           gpus=(GpuReport(index=0, uuid="GPU-n1-0", model="A100-40GB", instances=(found,)),)),
            )
            assert await ex.wait_for(lambda: ex.commands("stop"))
            (stop,) = ex.commands("stop")
            assert (stop.job_id, stop.instance_id) == ("ghost", IID)

            async def held_by() -> tuple[str, str | None]:
                (g,) = await ns.state.get_gpus(["n1/0"])
                i = next(i for i in g.instances if i.id == IID)
                return i.state, i.job

            assert await held_by() == ("retiring", "ghost")
            # a job that needs the whole GPU waits: the instance is not free
            await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("j1", "7g.40gb"))
            assert await until(is_(ns, "j1", "pending"))
            assert await held_by() == ("retiring", "ghost")

            # the node stops "ghost" (cmd_done and its exit): the instance idles and j1 gets the GPU
            ex.auto_ack = True
            await ns.bus.publish_batch(ex.reply(stop))
            assert await until(is_(ns, "j1", "running"))
            assert await audit(ns.state, GEO) == []
        finally:
            ex._consumer.stop()
            await task
            await stack.stop()
