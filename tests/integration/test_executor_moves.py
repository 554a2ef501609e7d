"""Make-before-break moves through the executor against a real NATS: the target starts before the source stops,
and a move whose job already ended creates no target yet still clears the target's way."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shared.events import CmdDone, CmdFailed, Command, JobExited, now
from tests.executor_bus_rig import NODE, Rig, create_ops, destroy_ops, is_done, move_start, place, started

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


@pytest.fixture
async def rig(nats_url: str, prefix: str) -> AsyncIterator[Rig]:
    async with started(nats_url, prefix) as r:
        yield r


async def test_a_migration_starts_the_target_before_it_stops_the_source(rig: Rig) -> None:
    await rig.send(place("c8", "j8", 0, "1g.5gb", 3))
    await rig.watch.until(is_done("c8"))
    dst = "n1/1:1g.5gb@6:j8-m1"
    await rig.send(move_start("c9", "j8", 1, dst, "n1/0:1g.5gb@3:j8",
                              create_ops(1, "1g.5gb", 6, dst)))
    moved = await rig.watch.until(is_done("c9"))
    assert isinstance(moved, CmdDone) and moved.instance is not None and moved.instance.instance_id == dst
    await rig.send(
        Command(
            id="c10",
            cmd_id="c10",
            kind="migrate_stop",
            node=NODE,
            gpu_index=0,
            job_id="j8",
            src_instance_id="n1/0:1g.5gb@3:j8",
            ops=destroy_ops(0, "1g.5gb", 3, "n1/0:1g.5gb@3:j8"),
            at=now(),
        )
    )
    assert isinstance(await rig.watch.until(is_done("c10")), CmdDone)
    running = rig.executor.backend.running()
    assert (running["j8"].gpu_index, running["j8"].start) == (1, 6)
    assert await rig.executor.backend.list_instances(0) == []
    assert not [m for m in rig.watch.of(JobExited) if m.job_id == "j8"]  # a move is not an exit


async def test_moving_a_job_that_already_ended_creates_no_target_and_reports_the_exit_first(
    rig: Rig,
) -> None:
    await rig.send(place("c11", "j11", 0, "2g.10gb", 0, duration=0.05))
    await rig.watch.until(lambda m: isinstance(m, JobExited) and m.job_id == "j11")
    dst = "n1/0:2g.10gb@4:j11.m1"
    await rig.send(move_start("c12", "j11", 0, dst, "n1/0:2g.10gb@0:j11",
                              create_ops(0, "2g.10gb", 4, dst)))
    failed = await rig.watch.until(is_done("c12"))
    assert isinstance(failed, CmdFailed) and "ended" in failed.error
    # the state store removes a target created for a move when it releases the job: the GPU agrees
    assert {(i.profile, i.start) for i in await rig.executor.backend.list_instances(0)} == {("2g.10gb", 0)}
    assert "j11" not in rig.executor.backend.running()
    order = [
        m
        for m in rig.watch.seen
        if getattr(m, "job_id", None) == "j11" and isinstance(m, JobExited | CmdFailed)
    ]
    assert isinstance(order[0], JobExited) and isinstance(order[-1], CmdFailed)


async def test_moving_a_job_that_already_ended_still_destroys_the_idle_instances_in_the_targets_way(
    rig: Rig,
) -> None:
    # The state store drops the idle instances a move destroys when it reserves the target (``migrate.lua``) and
    # never brings them back: a GPU that kept them held slices the state believed free, and every placement
    # there failed (overlap) until its job ran out of attempts (load.stragglers).
    await rig.send(place("c13", "j13", 0, "1g.5gb", 6, duration=0.05))  # leaves an idle 1g.5gb@6
    await rig.send(place("c14", "j14", 0, "2g.10gb", 0, duration=0.05))
    for job in ("j13", "j14"):
        await rig.watch.until(lambda m, job=job: isinstance(m, JobExited) and m.job_id == job)
    dst = "n1/0:3g.20gb@4:j14.m1"
    await rig.send(move_start("c15", "j14", 0, dst, "n1/0:2g.10gb@0:j14",
                              (*destroy_ops(0, "1g.5gb", 6, "n1/0:1g.5gb@6:j13"), *create_ops(0, "3g.20gb", 4, dst))))
    failed = await rig.watch.until(is_done("c15"))
    assert isinstance(failed, CmdFailed) and "ended" in failed.error
    # no target, and the idle instance in its way is gone, as it is from the state
    assert {(i.profile, i.start) for i in await rig.executor.backend.list_instances(0)} == {("2g.10gb", 0)}


