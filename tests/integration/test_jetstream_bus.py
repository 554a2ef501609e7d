"""What only the JetStream bus has: the streams' configuration on the server, the publish-acknowledgement timeout,
and consumers without acks that the server tracks no acks for. The behaviour both buses share is in
``tests/contract/test_event_bus.py``."""

from __future__ import annotations

import asyncio

import pytest

from services.common.testing import Namespace, make_settings
from shared.bus import BusError, Delivery, Outgoing
from shared.events import Demand, JobSubmit, Subjects, now

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


def submit(i: int) -> JobSubmit:
    return JobSubmit(id=f"m-{i}", job_id=f"j{i}", demand=Demand(kind="mig", profile="1g.5gb"), submitted_at=now())


async def test_the_five_streams_exist_with_namespaced_subjects(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        await ns.bus.ensure_streams()  # twice is fine
        s = Subjects(prefix)
        for name, subjects in s.streams().items():
            info = await ns.bus.js.stream_info(name)
            assert info.config.subjects == subjects
            # the dedupe window follows the ack wait unless set: a redelivered handler's republish is stored once
            assert info.config.duplicate_window == ns.settings.duplicate_window_s == 2 * ns.settings.ack_wait_s
        assert s.stream_jobs == f"{prefix}_JOBS" and s.jobs_submit == f"{prefix}.jobs.submit"
        assert Subjects("").stream_jobs == "JOBS" and Subjects("").cmd("n1") == "cmd.n1"


async def test_a_batch_whose_acknowledgement_never_comes_fails_within_the_publish_timeout(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url, publish_timeout_s=0.3)) as ns:
        silent = f"{prefix}-silent.x"
        heard: list[bytes] = []

        async def swallow(msg: object) -> None:  # a plain subscriber: it gets the message and answers nothing
            heard.append(msg.data)  # type: ignore[attr-defined]

        sub = await ns.bus.nc.subscribe(silent, cb=swallow)
        try:
            with pytest.raises(BusError, match="1 of 2 publishes not acknowledged"):
                await ns.bus.publish_batch(
                    [Outgoing(ns.bus.subjects.jobs_submit, submit(1)), Outgoing(silent, submit(2))]
                )
            assert len(heard) == 1 and not ns.bus.acks.futures  # nothing left waiting for an answer
            acks = await ns.bus.publish_batch([Outgoing(ns.bus.subjects.jobs_submit, submit(3))])
            assert acks[0].stream == ns.bus.subjects.stream_jobs and not acks[0].duplicate
        finally:
            await sub.unsubscribe()


async def test_a_consumer_without_acks_is_made_so_on_the_server(prefix: str, nats_url: str, redis_url: str) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        got: list[Delivery] = []

        async def keep(ds: list[Delivery]) -> None:
            got.extend(ds)

        c = ns.bus.consumer(ns.bus.subjects.stream_jobs, "hints", ns.bus.subjects.jobs_submit, keep, acks=False,
                            lost=lambda reason: None)
        await c.start()
        task = asyncio.create_task(c.run())
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit(1))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while not got and loop.time() < deadline:
            await asyncio.sleep(0.02)
        info = await ns.bus.js.consumer_info(ns.bus.subjects.stream_jobs, "hints")
        c.stop()
        await task
        assert len(got) == 1
        assert info.config.ack_policy == "none"
        assert info.num_ack_pending == 0 and info.num_pending == 0
