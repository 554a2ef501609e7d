"""The JetStream bus against a real NATS: streams, dedupe, batches, dead-letter with reasons, traces."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from services.common.testing import Namespace, make_settings
from shared.bus import BusError, Delivery, Outgoing
from shared.events import Demand, JobSubmit, Subjects, now

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


def submit(i: int, profile: str = "1g.5gb") -> JobSubmit:
    return JobSubmit(
        id=f"m-{i}", job_id=f"j{i}", demand=Demand(kind="mig", profile=profile), submitted_at=now()
    )


async def collect(ns: Namespace, durable: str, subject: str, handler=None, **kw):  # type: ignore[no-untyped-def]
    got: list[Delivery] = []

    async def default(ds: list[Delivery]) -> None:
        got.extend(ds)

    c = ns.bus.consumer(ns.bus.subjects.stream_jobs, durable, subject, handler or default, **kw)
    await c.start()
    return c, asyncio.create_task(c.run()), got


async def dlq(ns: Namespace, n: int, timeout: float = 5.0) -> list:  # type: ignore[type-arg]
    sub = await ns.bus.js.pull_subscribe(ns.bus.subjects.dlq(">"), stream=ns.bus.subjects.stream_dlq)
    out: list = []  # type: ignore[type-arg]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(out) < n and loop.time() < deadline:
        with contextlib.suppress(Exception):
            out.extend(await sub.fetch(n - len(out), timeout=0.5))
    return out


async def until(pred, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if pred():
            return True
        await asyncio.sleep(0.02)
    return bool(pred())


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


async def test_a_message_published_twice_with_one_id_is_consumed_once(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        c, task, got = await collect(ns, "dedupe", ns.bus.subjects.jobs_submit)
        first = await ns.bus.publish(ns.bus.subjects.jobs_submit, submit(1))
        again = await ns.bus.publish(ns.bus.subjects.jobs_submit, submit(1))
        await ns.bus.publish_batch([Outgoing(ns.bus.subjects.jobs_submit, submit(i)) for i in range(2, 300)])
        assert not first.duplicate and again.duplicate
        assert await until(lambda: len(got) >= 299)
        await asyncio.sleep(0.1)
        c.stop()
        await task
        assert sorted(d.data.job_id for d in got) == sorted(f"j{i}" for i in range(1, 300))


async def test_a_batch_is_acknowledged_per_message_by_the_stream(prefix: str, nats_url: str, redis_url: str) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        subj = ns.bus.subjects.jobs_submit
        acks = await ns.bus.publish_batch([Outgoing(subj, submit(i)) for i in range(5)])
        assert [a.stream for a in acks] == [ns.bus.subjects.stream_jobs] * 5
        assert [a.seq for a in acks] == list(range(acks[0].seq, acks[0].seq + 5)) and not any(a.duplicate for a in acks)
        again = await ns.bus.publish_batch([Outgoing(subj, submit(3)), Outgoing(subj, submit(9))])
        assert [(a.seq, bool(a.duplicate)) for a in again] == [(acks[3].seq, True), (acks[4].seq + 1, False)]
        with pytest.raises(BusError, match="no stream acknowledged"):  # no stream stores this subject
            await ns.bus.publish_batch([Outgoing(f"{prefix}-nostream.x", submit(1))])


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


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'{"id": "x", "job_id": ', "malformed JSON"),
        (b'{"id": "x", "job_id": "a b", "demand": {"profile": "1g.5gb"}, "submitted_at": 1}', "$.job_id"),
        (
            b'{"id": "x", "job_id": "j", "priority": 5000, "demand": {"profile": "1g.5gb"}, '
            b'"submitted_at": 1}',
            "$.priority",
        ),
        (
            b'{"id": "x", "job_id": "j", "demand": {"profile": "9g.99gb"}, "submitted_at": 1}',
            "unknown profile",
        ),
        (
            b'{"id": "x", "job_id": "j", "demand": {"profile": "1g.5gb", "compute_slices": 1}, '
            b'"submitted_at": 1}',
            "invalid demand",
        ),
    ],
)
async def test_an_invalid_submit_is_dead_lettered_with_its_reason(
    prefix: str, nats_url: str, redis_url: str, payload: bytes, reason: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        c, task, got = await collect(ns, "strict", ns.bus.subjects.jobs_submit)
        await ns.bus.js.publish(ns.bus.subjects.jobs_submit, payload, headers={"Nats-Msg-Id": "bad-1"})
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit(7))
        dead = await dlq(ns, 1)
        assert await until(lambda: len(got) == 1)
        c.stop()
        await task
        assert len(dead) == 1
        h = dead[0].headers
        assert reason in h["Migsched-Error"]
        assert h["Migsched-Original-Subject"] == ns.bus.subjects.jobs_submit
        assert h["Migsched-Original-Msg-Id"] == "bad-1" and "Nats-Msg-Id" in h
        assert dead[0].data == payload
        assert [d.data.job_id for d in got] == ["j7"]


async def test_a_message_that_keeps_failing_is_dead_lettered_after_max_deliveries(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url, max_deliver=3)) as ns:
        seen: list[int] = []

        async def flaky(ds: list[Delivery]) -> None:
            for d in ds:
                seen.append(d.deliveries)
                d.retry("downstream unavailable")

        c, task, _ = await collect(ns, "flaky", ns.bus.subjects.jobs_submit, flaky, retry_delay_s=0.01)
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit(1))
        dead = await dlq(ns, 1, timeout=10)
        c.stop()
        await task
        assert seen == [1, 2, 3]
        assert "downstream unavailable" in dead[0].headers["Migsched-Error"]
        assert dead[0].headers["Migsched-Deliveries"] == "3"


async def test_a_handler_that_raises_gets_the_batch_again(prefix: str, nats_url: str, redis_url: str) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        calls: list[int] = []

        async def crashes_once(ds: list[Delivery]) -> None:
            calls.append(len(ds))
            if len(calls) == 1:
                raise RuntimeError("boom")

        c, task, _ = await collect(
            ns, "crashy", ns.bus.subjects.jobs_submit, crashes_once, retry_delay_s=0.01
        )
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit(1))
        assert await until(lambda: len(calls) >= 2)
        c.stop()
        await task
        assert await dlq(ns, 1, timeout=0.5) == []


async def test_the_trace_context_travels_in_the_headers(prefix: str, nats_url: str, redis_url: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("test")
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        c, task, got = await collect(ns, "traced", ns.bus.subjects.jobs_submit)
        with tracer.start_as_current_span("submit") as span:
            trace_id = span.get_span_context().trace_id
            await ns.bus.publish(ns.bus.subjects.jobs_submit, submit(1))
        assert await until(lambda: len(got) == 1)
        c.stop()
        await task
        assert got[0].msg.headers["traceparent"].split("-")[1] == f"{trace_id:032x}"
        assert trace.get_current_span(got[0].ctx).get_span_context().trace_id == trace_id


async def test_a_consumer_without_acks_gets_each_message_once_and_the_server_tracks_no_acks(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url, ack_wait_s=0.5)) as ns:
        lost: list[str] = []
        c, task, got = await collect(ns, "hints", ns.bus.subjects.jobs_submit, acks=False, lost=lost.append)
        for i in range(5):
            await ns.bus.publish(ns.bus.subjects.jobs_submit, submit(i))
        assert await until(lambda: len(got) == 5)
        info = await ns.bus.js.consumer_info(ns.bus.subjects.stream_jobs, "hints")
        await asyncio.sleep(1.0)  # twice the ack wait: an explicit-ack consumer would redeliver by now
        c.stop()
        await task
        assert info.config.ack_policy == "none"
        assert info.num_ack_pending == 0 and info.num_pending == 0
        assert sorted(d.data.job_id for d in got) == [f"j{i}" for i in range(5)]
        assert lost == []


async def test_a_failed_batch_without_acks_is_reported_lost_and_not_redelivered(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url, ack_wait_s=0.5)) as ns:
        calls: list[int] = []
        lost: list[str] = []

        async def crashes(ds: list[Delivery]) -> None:
            calls.append(len(ds))
            raise RuntimeError("mirror broke")

        c, task, _ = await collect(ns, "fragile", ns.bus.subjects.jobs_submit, crashes, acks=False,
                                   lost=lost.append)
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit(1))
        assert await until(lambda: bool(lost))
        await asyncio.sleep(1.0)
        c.stop()
        await task
        assert calls == [1]  # not redelivered
        assert len(lost) == 1 and "mirror broke" in lost[0]
        assert await dlq(ns, 1, timeout=0.5) == []


async def test_an_undecodable_message_without_acks_is_still_dead_lettered(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        c, task, got = await collect(ns, "hints-dlq", ns.bus.subjects.jobs_submit, acks=False,
                                     lost=lambda reason: None)
        await ns.bus.js.publish(ns.bus.subjects.jobs_submit, b"{not json", headers={"Nats-Msg-Id": "bad-2"})
        dead = await dlq(ns, 1)
        c.stop()
        await task
        assert len(dead) == 1 and dead[0].data == b"{not json" and got == []


def test_a_consumer_without_acks_must_say_what_to_do_when_a_batch_is_lost() -> None:
    from shared.bus.consumer import Consumer

    class _Bus:
        settings = make_settings("x", "nats://127.0.0.1:4222", "redis://127.0.0.1:6379")
        subjects = Subjects("x")

    async def handler(ds: list[Delivery]) -> None:
        return None

    with pytest.raises(ValueError, match="lost"):
        Consumer(_Bus(), "S", "d", "x.jobs.exit", handler, acks=False)
