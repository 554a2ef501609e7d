"""Submits a replicated consumer skipped when its leader changed are read back and handed on, and only those."""

from __future__ import annotations

import time

import pytest

from services.balancer.missed_submits import MissedSubmits
from services.common.testing import make_settings
from shared.bus import Delivery, MemoryBus, Outgoing
from shared.events import Demand, JobSubmit, encode, now
from shared.state.memory_store import MemoryState

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]
DURABLE = "balancer-submit"
GRACE = 60.0


def submit(i: int) -> JobSubmit:
    return JobSubmit(id=f"m-{i}", job_id=f"j{i}", demand=Demand(kind="mig", profile="1g.5gb"), submitted_at=now())


class Rig:
    """A memory bus whose ``balancer-submit`` consumer records what it was handed, the state, and a clock."""

    def __init__(self) -> None:
        self.bus = MemoryBus(make_settings("missed", "nats://unused", "redis://unused"))
        self.state = MemoryState()
        self.t = time.time()
        self.got: list[str] = []
        self.missed = MissedSubmits(self.bus, self.state, self.bus.subjects.stream_jobs, DURABLE,
                                    self.bus.subjects.jobs_submit, GRACE, clock=lambda: self.t)

    async def start(self) -> None:
        await self.bus.ensure_streams()

        async def keep(ds: list[Delivery]) -> None:
            self.got.extend(d.data.job_id for d in ds)

        self.consumer = self.bus.consumer(self.bus.subjects.stream_jobs, DURABLE, self.bus.subjects.jobs_submit, keep)
        await self.consumer.start()

    async def publish(self, *ids: int) -> None:
        await self.bus.publish_batch([Outgoing(self.bus.subjects.jobs_submit, submit(i)) for i in ids])

    async def deliver(self, n: int) -> None:
        """Let the consumer hand out what it has, until ``n`` jobs were handed out in all."""
        while len(self.got) < n:
            await self.consumer.poll(0.1)

    async def known(self, job: str) -> None:
        """The balancer decided it: the state has its record."""
        await self.state.enqueue(job, encode(submit(int(job[1:]))), 0, now(), "no room", now())

    async def found(self) -> list[str]:
        return sorted(x.submit.job_id for x in await self.missed.poll())


@pytest.fixture
async def rig() -> Rig:
    r = Rig()
    await r.start()
    return r


async def test_a_submit_skipped_across_a_change_of_leader_is_found_once_the_grace_is_over(rig: Rig) -> None:
    assert await rig.found() == []  # the first look only notes the leader
    await rig.publish(1)
    await rig.deliver(1)
    await rig.publish(2)
    assert rig.bus.skip(rig.bus.subjects.stream_jobs, DURABLE) > 0  # j2, never handed out
    await rig.publish(3)
    await rig.deliver(2)
    await rig.known("j1")
    await rig.known("j3")
    assert rig.got == ["j1", "j3"]
    rig.bus.elect(rig.bus.subjects.stream_jobs, DURABLE)
    rig.t += 5
    assert await rig.found() == []  # the change is seen; any redelivery due may still come
    rig.t += GRACE - 1
    assert await rig.found() == []
    rig.t += 2
    assert await rig.found() == ["j2"]
    rig.t += 5
    assert await rig.found() == []  # each change is read back once


async def test_without_a_change_of_leader_nothing_is_read_back(rig: Rig) -> None:
    await rig.found()
    await rig.publish(1, 2)
    rig.bus.skip(rig.bus.subjects.stream_jobs, DURABLE)
    await rig.deliver(1)
    for _ in range(5):
        rig.t += GRACE
        assert await rig.found() == []


async def test_a_submit_the_consumer_has_not_reached_yet_is_left_to_it(rig: Rig) -> None:
    await rig.found()
    await rig.publish(1)
    await rig.deliver(1)
    await rig.known("j1")
    rig.bus.elect(rig.bus.subjects.stream_jobs, DURABLE)
    await rig.publish(2)  # stored, not delivered yet: past the consumer's delivered sequence
    rig.t += 1
    await rig.found()
    rig.t += GRACE + 1
    assert await rig.found() == []
    await rig.deliver(2)
    assert rig.got == ["j1", "j2"]


async def test_two_changes_before_the_look_back_read_back_from_the_earlier_one(rig: Rig) -> None:
    await rig.found()
    await rig.publish(1, 2)
    rig.bus.skip(rig.bus.subjects.stream_jobs, DURABLE)  # j1
    await rig.deliver(1)
    await rig.known("j2")
    rig.bus.elect(rig.bus.subjects.stream_jobs, DURABLE)
    rig.t += 5
    await rig.found()
    rig.bus.elect(rig.bus.subjects.stream_jobs, DURABLE)
    rig.t += GRACE - 10
    assert await rig.found() == []  # the second change moved the look back
    rig.t += GRACE
    assert await rig.found() == ["j1"]


async def test_a_consumer_that_does_not_exist_yet_has_skipped_nothing() -> None:
    r = Rig()
    await r.bus.ensure_streams()
    await r.publish(1)
    assert await r.found() == []
    r.t += 10 * GRACE
    assert await r.found() == []
