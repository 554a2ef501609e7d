"""Generator + recorder against a real NATS with a stand-in stack: every job is accounted for exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest

from load.fakestack import FakeStack
from load.generator import Generator, JobFactory, steady
from load.recorder import STAGES, Recorder
from shared.events import Subjects

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

N = 400


@pytest.fixture
async def conns(nats_url: str) -> AsyncIterator[list]:
    # generator, recorder, stack: three connections, as in a real run
    ncs = [await nats.connect(nats_url, connect_timeout=10) for _ in range(3)]
    yield ncs
    for nc in ncs:
        await nc.close()


class LossyStack(FakeStack):
    """Drops every 10th job after placing it and places every 7th job twice."""

    finished = 0

    async def _on_submit(self, msg) -> None:  # type: ignore[no-untyped-def]
        job_id = msg.data.split(b'"job_id":"')[1].split(b'"')[0]
        i = int(job_id.rsplit(b"-", 1)[1])
        if i % 10 == 0:
            await self.nc.publish(self.subjects.sched_placed, b'{"v":1,"id":"p","job_id":"%s"}' % job_id)
        else:
            for _ in range(2 if i % 7 == 0 else 1):
                await super()._on_submit(msg)
        self.finished += 1


async def settle(stack: FakeStack, rec: Recorder, stack_nc) -> None:  # type: ignore[no-untyped-def]
    """Until the recorder has processed everything the stack published (no sleeping on a guess): the stack
    has handled every submit, then a sentinel on the recorder's single, ordered subscription comes through."""
    for _ in range(1000):
        if getattr(stack, "finished", stack.handled) >= N:
            break
        await asyncio.sleep(0.01)
    await stack_nc.publish(stack.subjects.sched_placed, b'{"v":1,"id":"s","job_id":"sentinel"}')
    await stack_nc.flush()
    for _ in range(1000):
        if rec.foreign:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the recorder never saw the sentinel")


async def drive(conns: list, prefix: str, stack_cls: type[FakeStack], final: str) -> tuple:
    gen_nc, rec_nc, stack_nc = conns
    subjects = Subjects(prefix)
    stack = stack_cls(stack_nc, subjects)
    await stack.ensure_stream()
    await stack.start()
    rec = Recorder("run", subjects, final=final, keep_jobs=True, ordered=True)
    await rec.attach(rec_nc)
    gen = Generator(gen_nc, subjects, JobFactory("run", duration_hint_s=0.05), steady(1000, N / 1000),
                    on_submit=rec.submitted)
    try:
        stats = await gen.run()
        assert await gen.wait_acks(10) == 0
        complete = await rec.wait_complete(10 if final == "exit" else 0.01)
        await settle(stack, rec, stack_nc)
    finally:
        await stack.stop()
        await stack.remove_stream()
    return stats, rec, complete


async def test_every_submitted_job_is_seen_once_at_every_stage_in_order(conns, prefix: str) -> None:
    stats, rec, complete = await drive(conns, prefix, FakeStack, final="exit")
    assert complete
    assert (stats.sent, stats.acked, stats.unacked, dict(stats.ack_errors)) == (N, N, 0, {})
    assert {s: rec.reached[s] for s in STAGES} == dict.fromkeys(STAGES, N)
    assert rec.lost() == dict.fromkeys(STAGES, 0)
    # foreign 1: the sentinel of settle()
    assert (dict(rec.duplicates), dict(rec.errors), rec.foreign, rec.reordered) == ({}, {}, 1, 0)
    assert rec.exit_kinds == {"completed": N}
    assert set(rec.done) == {f"run-{i}" for i in range(N)}
    for tl in rec.done.values():  # ordered: one subscription per namespace keeps the wire order per job
        stamps = [tl[s] for s in ("submit", *STAGES)]
        assert stamps == sorted(stamps)
    assert {name: h.get_total_count() for name, h in rec.hist.items()} == dict.fromkeys(rec.hist, N)


async def test_lost_and_duplicated_jobs_are_counted_exactly(conns, prefix: str) -> None:
    stats, rec, complete = await drive(conns, prefix, LossyStack, final="running")
    dropped = N // 10
    doubled = len([i for i in range(N) if i % 7 == 0 and i % 10 != 0])
    assert not complete and stats.acked == N
    assert rec.lost() == {"placed": 0, "command": dropped, "running": dropped}  # exit is not awaited
    assert rec.duplicates == {"placed": doubled, "command": doubled, "running": doubled}
    assert set(rec.timelines) == {f"run-{i}" for i in range(0, N, 10)}


async def test_every_publish_carries_its_dedupe_id_so_a_repeated_run_is_stored_once(conns, prefix: str) -> None:
    gen_nc, stack_nc, _ = conns
    subjects = Subjects(prefix)
    stack = FakeStack(stack_nc, subjects)
    await stack.ensure_stream()
    try:
        schedule = list(steady(1000, 0.02))
        first = Generator(gen_nc, subjects, JobFactory("dup"), schedule)
        await first.run()
        again = Generator(gen_nc, subjects, JobFactory("dup"), schedule)  # the same ids, sent again
        await again.run()
        assert await first.wait_acks(5) == 0 and await again.wait_acks(5) == 0
        assert (first.stats.acked, first.stats.duplicates) == (20, 0)
        assert (again.stats.acked, again.stats.duplicates) == (20, 20)
    finally:
        await stack.remove_stream()
