"""A place command the registry timed out, applied late by an executor that restarted mid-load
(docs/architecture.md, data flow step 6): the registry stops that run (and only it), holds its instance until the
node confirms, and the job, re-placed on another node, ends exactly once. Real NATS and Redis, the in-process
stack; the time-out is applied by calling what the command sweep calls, so no clock is involved."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from services.balancer.service import Balancer
from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings
from shared.events import CmdDone, InstanceReport
from shared.mig.geometry import default_geometry
from shared.state import audit
from tests.integration.test_registry_flow import is_, submit, until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
GEO = default_geometry()
NEVER = 600.0  # node and command time-outs far longer than the test: only the test times the command out


async def test_a_place_applied_after_its_time_out_is_stopped_and_the_job_ends_once(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, node_timeout_s=NEVER, cmd_timeout_s=NEVER)
        await stack.start()
        watch = await ns.watch_exits()
        n1 = ScriptedExecutor(ns.bus, "n1", gpus=1, auto_ack=False)  # restarting: answers nothing for now
        n2 = ScriptedExecutor(ns.bus, "n2", gpus=1)
        balancer: Any = None
        try:
            await n1.start()
            assert await until(lambda: _ready(stack, 1))
            await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("j1", "7g.40gb"))
            assert await n1.wait_for(lambda: n1.commands("place"))
            (late,) = n1.commands("place")
            assert late.cmd_id == "place:j1:0" and late.instance_id

            # no result in time: the sweep fails the placement (j1 back in the queue). The balancer is held
            # off meanwhile, so that j1 is placed again only where the late run does not hold the GPU.
            await stack.balancer.stop()
            stack.services.remove(stack.balancer)
            await stack.registry.nodes.placement_failed("j1", f"no result for {late.cmd_id}", late.cmd_id)
            assert await until(is_(ns, "j1", "pending"))

            # the executor, back, applies the command late: j1 starts on n1 and its cmd_done comes in
            p = GEO.model("A100-40GB").profile("7g.40gb")
            n1.running["j1"] = late  # its exit will name the instance, as an executor's does
            await ns.bus.publish(
                ns.bus.subjects.node_report("n1"),
                CmdDone(id=f"{late.cmd_id}.done", node="n1", at=time.time(), cmd_id=late.cmd_id, command="place",
                        job_id="j1",
                        instance=InstanceReport(instance_id=late.instance_id, gi_id=1, profile=p.name,
                                                profile_id=p.profile_id, start=0, size=p.memory_slices,
                                                job_id="j1")),
            )
            assert await n1.wait_for(lambda: n1.commands("stop"))
            (stop,) = n1.commands("stop")
            assert (stop.job_id, stop.instance_id, stop.src_instance_id) == ("j1", late.instance_id, late.instance_id)
            assert stop.cmd_id == f"stop:j1:{late.cmd_id}"
            assert await _holder(ns, "n1/0", late.instance_id) == ("retiring", "j1")
            assert (await ns.state.job("j1")).state == "pending"  # the late run revives nothing
            assert await audit(ns.state, GEO) == []

            # the balancer back and a second node: j1 goes there, not on the GPU the late run holds
            await n2.start()
            balancer = await Balancer.create(stack._b)
            await balancer.start()
            assert await until(is_(ns, "j1", "running"))
            j = await ns.state.job("j1")
            assert (j.node, j.gpu) == ("n2", "n2/0")
            assert await _holder(ns, "n1/0", late.instance_id) == ("retiring", "j1")
            assert await audit(ns.state, GEO) == []

            # n1 confirms the stop (its cmd_done and the run's exit): the instance idles; j1 carries on on n2
            await ns.bus.publish_batch(n1.reply(stop))
            assert await until(lambda: _holder_is(ns, "n1/0", late.instance_id, ("idle", None)))
            assert (await ns.state.job("j1")).state == "running"

            # j1 ends on n2: finished, one jobs.exit, nothing held, the state clean
            await n2.exit(["j1"])
            assert await until(is_(ns, "j1", "finished"))
            await asyncio.sleep(0.5)  # time for a second exit to show, were one published
            assert [(e.job_id, e.node, e.kind) for e in watch.seen] == [("j1", "n2", "completed")]
            assert await audit(ns.state, GEO) == []
        finally:
            await watch.close()
            if balancer is not None:
                await balancer.stop()
            await n2.stop()
            await n1.stop()
            await stack.stop()


async def _ready(stack: Stack, n: int) -> bool:
    return len(stack.balancer.mirrors[0]) >= n


async def _holder(ns: Namespace, gid: str, iid: str) -> tuple[str, str | None]:
    (g,) = await ns.state.get_gpus([gid])
    i = next(i for i in g.instances if i.id == iid)
    return i.state, i.job


async def _holder_is(ns: Namespace, gid: str, iid: str, want: tuple[str, str | None]) -> bool:
    return await _holder(ns, gid, iid) == want
