"""Moves that end without taking, through the node registry and registry on real NATS and Redis
(docs/architecture.md, data flow steps 5 and 9): the state and the GPU must agree on every instance afterwards.

- A job whose source copy exits during its move to another node: that node created the target and may run the
  job's copy there. The registry sends it a ``stop`` of that run only and holds the target until it confirms.
- A node lost while one of its jobs moves to another node: the job is re-queued and the other node told to
  ``stop`` its copy, whose instance stays taken until that node confirms.
- A ``migrate_start`` the target's node failed: the idle instance the move had removed from the target's way
  may or may not be destroyed; the node registry sends it a ``destroy_idle`` and holds it until the answer.
- A move order consumed after its job ended: no target is made; the node only destroys the idle instance the
  reserve removed from the target's way."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings
from shared.events import (
    CmdDone,
    CmdFailed,
    Command,
    JobExited,
    JobInfo,
    MigrateOrder,
    MoveSpec,
    new_id,
    wire_gpu,
)
from shared.mig.geometry import default_geometry
from shared.state import StoredInstance, audit
from tests.integration.test_migration_planner_flow import run_job
from tests.integration.test_registry_flow import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
GEO = default_geometry()
NEVER = 600.0


async def _ready(ns: Namespace, gpus: int) -> bool:
    return len(await ns.state.gpu_ids()) == gpus


async def _held(ns: Namespace, gpu: str) -> list[tuple[str, str, str | None]]:
    (g,) = await ns.state.get_gpus([gpu])
    return sorted((i.id, i.state, i.job) for i in g.instances)


async def _destroy_confirmed(ns: Namespace, destroy: Command, gpu: str) -> bool:
    """The node confirms ``destroy`` (a ``destroy_idle``): the instance leaves ``gpu`` in the state, which stays
    sound."""
    await ns.bus.publish(
        ns.bus.subjects.node_report("n1"),
        CmdDone(id=f"{destroy.cmd_id}.done", node="n1", at=time.time(), cmd_id=destroy.cmd_id,
                command="destroy_idle"),
    )

    async def dropped() -> bool:
        return all(i.id != destroy.instance_id for i in (await ns.state.get_gpus([gpu]))[0].instances)

    return await until(dropped) and await audit(ns.state, GEO) == []


async def _moving_across(ns: Namespace, n1: ScriptedExecutor, n2: ScriptedExecutor,
                         ) -> tuple[str, StoredInstance]:
    """j1 running on n1/0 and being moved to n2/0: its source instance id and the move's target."""
    await n1.start()
    await n2.start()
    assert await until(lambda: _ready(ns, 2))
    src = await run_job(ns, "j1", "n1/0", "1g.5gb", 0)
    dst = StoredInstance(id="n2/0:1g.5gb@6:j1.m1", profile="1g.5gb", start=6, size=1, compute=1)
    await _move(ns, "j1", src, "n2/0", dst, ())
    return src, dst


async def _confirm_stop(ns: Namespace, stop: Command) -> None:
    """n2 confirms ``stop`` (of j1's copy there)."""
    await ns.bus.publish(
        ns.bus.subjects.node_report("n2"),
        CmdDone(id=f"{stop.cmd_id}.done", node="n2", at=time.time(), cmd_id=stop.cmd_id, command="stop",
                job_id="j1"),
    )


async def _move(ns: Namespace, job: str, src: str, dst_gpu: str, dst: StoredInstance, destroy: tuple[str, ...]) -> None:
    (g,) = await ns.state.get_gpus([dst_gpu])
    b = ns.state.batch()
    b.migrate_reserve(job, src, dst_gpu, g.ver, dst, destroy, 7, 120.0, "defrag", time.time())
    assert (await b.run())[0][0] == "ok"


async def test_a_source_exit_during_a_move_to_another_node_stops_the_target_copy_and_holds_its_instance(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, node_timeout_s=NEVER, cmd_timeout_s=NEVER)
        await stack.start()
        watch = await ns.watch_exits()
        n1 = ScriptedExecutor(ns.bus, "n1", gpus=1)
        n2 = ScriptedExecutor(ns.bus, "n2", gpus=1, auto_ack=False)  # the test answers for it
        try:
            src, dst = await _moving_across(ns, n1, n2)
            # n2 started the copy (its migrate_start is in flight); the source copy ends on n1 meanwhile
            await ns.bus.publish(
                ns.bus.subjects.node_report("n1"),
                JobExited(id=new_id("x"), node="n1", at=time.time(), job_id="j1", gpu_index=0, instance_id=src,
                          exit="completed"),
            )
            assert await n2.wait_for(lambda: n2.commands("stop"))
            (stop,) = n2.commands("stop")
            assert (stop.job_id, stop.instance_id, stop.src_instance_id) == ("j1", dst.id, dst.id)
            assert (await ns.state.job("j1")).state == "finished"
            assert await _held(ns, "n2/0") == [(dst.id, "retiring", "j1")]  # not offered to other jobs
            assert await audit(ns.state, GEO) == []
            # n2 confirms the stop: the instance it holds is idle, as it is on the GPU
            await _confirm_stop(ns, stop)

            async def idled() -> bool:
                return await _held(ns, "n2/0") == [(dst.id, "idle", None)]

            assert await until(idled)
            assert [e.job_id for e in watch.seen] == ["j1"]
            assert await audit(ns.state, GEO) == []
        finally:
            await watch.close()
            await n1.stop()
            await n2.stop()
            await stack.stop()


async def test_a_node_lost_during_a_move_to_another_node_has_that_node_stop_the_target_copy_before_its_reuse(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, node_timeout_s=1.5, cmd_timeout_s=NEVER)
        await stack.start()
        n1 = ScriptedExecutor(ns.bus, "n1", gpus=1)
        n2 = ScriptedExecutor(ns.bus, "n2", gpus=1, auto_ack=False)  # the test answers for it
        beating = {"n1", "n2"}

        async def heartbeats() -> None:
            while True:
                for ex in (n1, n2):
                    if ex.node in beating:
                        await ex.heartbeat()
                await asyncio.sleep(0.2)

        beats = asyncio.create_task(heartbeats())
        try:
            _, dst = await _moving_across(ns, n1, n2)
            beating.discard("n1")  # n1 falls silent mid-move; n2 may have started the job's copy
            assert await n2.wait_for(lambda: n2.commands("stop"), timeout=15)
            (stop,) = n2.commands("stop")
            assert (stop.job_id, stop.instance_id) == ("j1", dst.id)
            assert (await ns.state.nodes())["n1"]["state"] == "lost"
            assert (dst.id, "retiring", "j1") in await _held(ns, "n2/0")  # not offered to other jobs meanwhile
            assert await audit(ns.state, GEO) == []
            await _confirm_stop(ns, stop)

            async def idled() -> bool:
                return (dst.id, "idle", None) in await _held(ns, "n2/0")

            assert await until(idled)
            assert await audit(ns.state, GEO) == []
        finally:
            beats.cancel()
            await n1.stop()
            await n2.stop()
            await stack.stop()


async def test_a_failed_move_start_sends_a_destroy_for_the_idle_instance_the_move_removed_from_its_way(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, node_timeout_s=NEVER, cmd_timeout_s=NEVER)
        await stack.start()
        n1 = ScriptedExecutor(ns.bus, "n1", gpus=2, auto_ack=False)
        try:
            await n1.start(instances=[(1, "7g.40gb", 0)])  # an idle 7g.40gb on GPU 1
            assert await until(lambda: _ready(ns, 2))
            (g1,) = await ns.state.get_gpus(["n1/1"])
            (idle,) = [i.id for i in g1.instances]
            src = await run_job(ns, "j2", "n1/0", "1g.5gb", 0)
            dst = StoredInstance(id="n1/1:1g.5gb@6:j2.m1", profile="1g.5gb", start=6, size=1, compute=1)
            await _move(ns, "j2", src, "n1/1", dst, (idle,))
            await ns.bus.publish(
                ns.bus.subjects.node_report("n1"),
                CmdFailed(id="mig:j2:m1:start.failed", node="n1", at=time.time(), cmd_id="mig:j2:m1:start",
                          command="migrate_start", job_id="j2", error="create refused"),
            )
            assert await n1.wait_for(lambda: n1.commands("destroy_idle"))
            (destroy,) = n1.commands("destroy_idle")
            assert destroy.cmd_id == f"destroy:{idle}"
            assert (await ns.state.job("j2")).state == "running"
            assert await _held(ns, "n1/1") == [(idle, "retiring", None)]  # destroyed or not: held until told
            assert await audit(ns.state, GEO) == []
            assert await _destroy_confirmed(ns, destroy, "n1/1")
            assert await _held(ns, "n1/1") == []
        finally:
            await n1.stop()
            await stack.stop()


async def test_a_job_ending_before_its_move_started_holds_and_destroys_the_idle_instance_in_the_targets_way(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, node_timeout_s=NEVER, cmd_timeout_s=NEVER)
        await stack.start()
        n1 = ScriptedExecutor(ns.bus, "n1", gpus=2, auto_ack=False)
        try:
            await n1.start(instances=[(1, "7g.40gb", 0)])  # an idle 7g.40gb on GPU 1, in the target's way
            assert await until(lambda: _ready(ns, 2))
            src = await run_job(ns, "j3", "n1/0", "1g.5gb", 0)
            snap, _ = await ns.state.snapshot(GEO, 0)
            seen = snap.gpu("n1/1")  # the target as the planner saw it, before its reserve
            (idle,) = [i.id for i in seen.instances]
            dst = StoredInstance(id="n1/1:1g.5gb@6:j3.m1", profile="1g.5gb", start=6, size=1, compute=1)
            await _move(ns, "j3", src, "n1/1", dst, (idle,))
            # the job ends on its source before the node registry reads the order: the instance in the target's
            # way, which the move's ops never destroyed, is held and sent a destroy (placements there were
            # refused for overlap while the state showed it free)
            await ns.bus.publish(
                ns.bus.subjects.node_report("n1"),
                JobExited(id=new_id("x"), node="n1", at=time.time(), job_id="j3", gpu_index=0, instance_id=src,
                          exit="completed"),
            )

            async def finished() -> bool:
                j = await ns.state.job("j3")
                return j is not None and j.state == "finished"

            assert await until(finished)

            def destroys() -> list[Any]:  # (retention may destroy the freed source too: not this test's concern)
                return [c for c in n1.commands("destroy_idle") if c.cmd_id == f"destroy:{idle}"]

            assert await n1.wait_for(destroys)
            (destroy,) = destroys()
            assert await _held(ns, "n1/1") == [(idle, "retiring", None)]
            assert await audit(ns.state, GEO) == []
            move = MoveSpec(job_id="j3", kind="inter", src_gpu="n1/0", src_instance=src, src_profile="1g.5gb",
                            src_start=0, dst_gpu="n1/1", dst_profile="1g.5gb", dst_start=6, dst_size=1,
                            destroy=(idle,))
            await ns.bus.publish(
                ns.bus.subjects.sched_migrate,
                MigrateOrder(id="migrate:j3:m1", move=move, src_node="n1", dst_node="n1", dst_instance=dst.id,
                             nonce="m1", dst_gpu_view=wire_gpu(seen), job=JobInfo(), decided_at=time.time()),
            )

            async def consumed() -> bool:
                info = await ns.bus.js.consumer_info(ns.bus.subjects.stream_sched, "partitioner-migrate")
                return info.num_pending == 0 and info.num_ack_pending == 0 and info.delivered.stream_seq > 0

            assert await until(consumed)
            assert not n1.commands("migrate_start")  # no target made for a job that is over
            # the release's destroy is the only one: a second could find a newer instance at that place
            assert not [c for c in n1.commands("destroy_idle") if c.cmd_id.startswith("mig:")]
            assert await _held(ns, "n1/1") == [(idle, "retiring", None)]
            assert await _destroy_confirmed(ns, destroy, "n1/1")
            assert await _held(ns, "n1/1") == []
        finally:
            await n1.stop()
            await stack.stop()
