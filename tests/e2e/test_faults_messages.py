"""Duplicate, reordered and late messages against the scheduling services (in process, real NATS and Redis,
a namespace of its own) and a scripted executor that answers when and how the test says.

After each: every job is accounted for exactly once (one state, at most one ``jobs.exit``), no slice is
double-booked (``audit()`` clean) and nothing is left holding slices.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings, until
from shared.bus import Outgoing
from shared.events import CmdDone, Demand, JobCancel, JobExit, JobExited, JobSubmit, now
from shared.mig.geometry import default_geometry
from shared.state import audit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]
GEO = default_geometry()


def submit(job: str, msg_id: str | None = None) -> JobSubmit:
    return JobSubmit(
        id=msg_id or f"s-{job}",
        job_id=job,
        demand=Demand(kind="mig", profile="1g.5gb"),
        submitted_at=now(),
        duration_hint_s=60.0,
    )




class World:
    def __init__(self, ns: Namespace, stack: Stack, ex: ScriptedExecutor) -> None:
        self.ns, self.stack, self.ex = ns, stack, ex
        self.subj = ns.bus.subjects

    async def state_of(self, job: str) -> str:
        j = await self.ns.state.job(job)
        return j.state if j else ""

    async def becomes(self, job: str, state: str, timeout: float = 10.0) -> None:
        assert await until(lambda: self._is(job, state), timeout), (
            f"{job}: {await self.state_of(job)} != {state}"
        )

    async def _is(self, job: str, state: str) -> bool:
        return await self.state_of(job) == state

    async def exits(self) -> Counter[str]:
        sub = await self.ns.bus.js.pull_subscribe(
            self.subj.jobs_exit, durable=None, stream=self.subj.stream_jobs
        )
        out: Counter[str] = Counter()
        try:
            while True:
                try:
                    msgs = await sub.fetch(200, timeout=0.5)
                except Exception:
                    break
                for m in msgs:
                    out[msgspec.json.decode(m.data, type=JobExit).job_id] += 1
                    await m.ack()
        finally:
            await sub.unsubscribe()
        return out

    async def clean(self) -> None:
        """Quiescent: no violation, no instance holding a job, nothing placing."""

        async def ok() -> bool:
            gpus = await self.ns.state.load_gpus()
            return not await audit(self.ns.state, GEO) and all(
                i.state in ("idle", "retiring") for g in gpus for i in g.instances
            )

        assert await until(ok, 10), [str(v) for v in await audit(self.ns.state, GEO)]

    def places(self, job: str) -> list[Any]:
        return [c for c in self.ex.commands("place") if c.job_id == job]

    async def report(self, *msgs: Any) -> None:
        await self.ns.bus.publish_batch([Outgoing(self.subj.node_report("n1"), m) for m in msgs])


@pytest.fixture
async def world(prefix: str, nats_url: str, redis_url: str) -> AsyncIterator[World]:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, retention_window_s=0.0)
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=2)
        try:
            await ex.start()
            assert await until(lambda: len(stack.balancer.mirrors[0]) >= 2)
            yield World(ns, stack, ex)
        finally:
            await ex.stop()
            await stack.stop()


async def test_the_same_submit_twice_with_the_same_msg_id_is_stored_and_placed_once(world: World) -> None:
    s = submit("dup1")
    a1 = await world.ns.bus.publish(world.subj.jobs_submit, s)
    a2 = await world.ns.bus.publish(world.subj.jobs_submit, s)
    assert not a1.duplicate and a2.duplicate  # JetStream's duplicate window dropped the second
    await world.becomes("dup1", "running")
    await world.ex.exit(["dup1"])
    await world.becomes("dup1", "finished")
    assert len(world.places("dup1")) == 1
    assert (await world.exits())["dup1"] == 1
    await world.clean()


async def test_the_same_job_submitted_twice_with_different_msg_ids_runs_once(world: World) -> None:
    await world.ns.bus.publish(world.subj.jobs_submit, submit("dup2", "s-dup2-a"))
    await world.becomes("dup2", "running")
    await world.ns.bus.publish(world.subj.jobs_submit, submit("dup2", "s-dup2-b"))  # while it runs
    await asyncio.sleep(0.5)
    await world.ex.exit(["dup2"])
    await world.becomes("dup2", "finished")
    await world.ns.bus.publish(world.subj.jobs_submit, submit("dup2", "s-dup2-c"))  # after it ended
    await asyncio.sleep(0.5)
    assert await world.state_of("dup2") == "finished"
    assert len(world.places("dup2")) == 1
    assert (await world.exits())["dup2"] == 1
    await world.clean()


async def test_an_exit_reported_before_its_placement_is_confirmed_ends_the_job_once(world: World) -> None:
    world.ex.auto_ack = False
    await world.ns.bus.publish(world.subj.jobs_submit, submit("early"))
    assert await until(lambda: world.places("early"))
    cmd = world.places("early")[0]
    world.ex.running["early"] = cmd
    exited = world.ex._exit("early", "completed", "done")
    done = CmdDone(
        id=f"{cmd.cmd_id}.done", node="n1", at=now(), cmd_id=cmd.cmd_id, command="place", job_id="early"
    )
    await world.report(exited, done)  # the exit overtakes the confirmation
    await world.becomes("early", "finished")
    await asyncio.sleep(0.3)
    assert await world.state_of("early") == "finished"  # the late confirmation does not revive it
    assert (await world.exits())["early"] == 1
    await world.clean()


async def test_an_exit_of_a_job_never_submitted_is_ignored_and_a_later_submit_still_runs(
    world: World,
) -> None:
    await world.report(
        JobExited(
            id="ghost-exit",
            node="n1",
            at=now(),
            job_id="later",
            exit="completed",
            instance_id="n1/0:1g.5gb@6:later",
            gpu_index=0,
        )
    )
    await asyncio.sleep(0.3)
    assert await world.state_of("later") == ""
    await world.ns.bus.publish(world.subj.jobs_submit, submit("later"))
    await world.becomes("later", "running")
    await world.ex.exit(["later"])
    await world.becomes("later", "finished")
    assert (await world.exits())["later"] == 1
    await world.clean()


async def test_a_result_for_a_cancelled_job_changes_nothing(world: World) -> None:
    await world.ns.bus.publish(world.subj.jobs_submit, submit("cx"))
    await world.becomes("cx", "running")
    place = world.places("cx")[0]
    await world.ns.bus.publish(world.subj.jobs_cancel, JobCancel(id="c-cx", job_id="cx", at=now()))
    await world.becomes("cx", "cancelled")  # stop -> the executor's exit (cancelled) released it
    # late: the placement's confirmation again, a completed exit, and a start, all for the cancelled job
    await world.report(
        CmdDone(id="late-done", node="n1", at=now(), cmd_id=place.cmd_id, command="place", job_id="cx"),
        JobExited(
            id="late-exit",
            node="n1",
            at=now(),
            job_id="cx",
            exit="completed",
            instance_id=place.instance_id,
            gpu_index=place.gpu_index,
        ),
    )
    await asyncio.sleep(0.5)
    assert await world.state_of("cx") == "cancelled"
    assert (await world.exits())["cx"] == 1
    await world.clean()


async def test_a_cancel_while_the_placement_is_in_flight_ends_the_job_cancelled(world: World) -> None:
    world.ex.auto_ack = False
    await world.ns.bus.publish(world.subj.jobs_submit, submit("cy"))
    assert await until(lambda: world.places("cy"))
    await world.ns.bus.publish(world.subj.jobs_cancel, JobCancel(id="c-cy", job_id="cy", at=now()))
    assert await until(lambda: [c for c in world.ex.commands("stop") if c.job_id == "cy"])
    # the executor now answers in stream order: the placement, then the stop (with the cancelled exit)
    out: list[Outgoing] = []
    for c in world.ex.commands():
        if c.job_id == "cy":
            out += world.ex.reply(c)
    await world.ns.bus.publish_batch(out)
    await world.becomes("cy", "cancelled")
    assert (await world.exits())["cy"] == 1
    await world.clean()


async def test_a_cancel_before_the_submit_leaves_a_tombstone_and_the_late_submit_never_runs(
    world: World,
) -> None:
    await world.ns.bus.publish(world.subj.jobs_cancel, JobCancel(id="c-cz", job_id="cz", at=now()))
    await world.becomes("cz", "cancelled")
    await world.ns.bus.publish(world.subj.jobs_submit, submit("cz"))
    await asyncio.sleep(0.5)
    assert await world.state_of("cz") == "cancelled"
    assert world.places("cz") == []
    await world.clean()


async def test_a_duplicated_exit_report_with_new_ids_is_published_once(world: World) -> None:
    await world.ns.bus.publish(world.subj.jobs_submit, submit("dx"))
    await world.becomes("dx", "running")
    place = world.places("dx")[0]
    exits = [
        JobExited(
            id=f"exit-dx-{n}",
            node="n1",
            at=now(),
            job_id="dx",
            exit="completed",
            instance_id=place.instance_id,
            gpu_index=place.gpu_index,
        )
        for n in range(3)
    ]
    await world.report(*exits)
    await world.becomes("dx", "finished")
    await world.report(
        JobExited(
            id="exit-dx-late",
            node="n1",
            at=now(),
            job_id="dx",
            exit="failed",
            instance_id=place.instance_id,
            gpu_index=place.gpu_index,
        ),
        # a late copy from an executor restarted mid-run, which no longer knows the instance
        JobExited(id="exit-dx-unnamed", node="n1", at=now(), job_id="dx", exit="completed"),
    )
    await asyncio.sleep(0.5)
    assert await world.state_of("dx") == "finished"
    assert (await world.exits())["dx"] == 1
    await world.clean()

