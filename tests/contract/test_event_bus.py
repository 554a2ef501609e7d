"""The event bus's contract: every case runs on the in-memory bus and on NATS JetStream, and both implement the port.

Streams, dedupe, batches, redelivery, dead letters with reasons, shared durables, ephemeral consumers, consumers
without acks, and the trace context in the headers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from services.common.testing import until
from shared.bus import BusError, Consumer, Delivery, JetStreamBus, MemoryBus, Outgoing
from shared.bus.consumer import raw
from shared.events import Demand, JobCancel, JobSubmit, now
from shared.ports import EventBus

pytestmark = pytest.mark.timeout(60)

MakeBus = Callable[..., Awaitable[Any]]
decode_submit = msgspec.json.Decoder(JobSubmit).decode


def submit(i: int, profile: str = "1g.5gb") -> JobSubmit:
    return JobSubmit(id=f"m-{i}", job_id=f"j{i}", demand=Demand(kind="mig", profile=profile), submitted_at=now())




class Collected:
    """A running consumer and what its handler got."""

    def __init__(self, consumer: Consumer, got: list[Delivery]) -> None:
        self.consumer, self.got = consumer, got
        self.task: asyncio.Task[None] | None = None

    async def stop(self) -> None:
        self.consumer.stop()
        if self.task is not None:
            await self.task


async def collect(bus: Any, durable: str, subject: str | None = None, handler: Any = None, stream: str | None = None,
                  **kw: Any) -> Collected:
    got: list[Delivery] = []

    async def keep(ds: list[Delivery]) -> None:
        got.extend(ds)

    c = bus.consumer(stream or bus.subjects.stream_jobs, durable, subject or bus.subjects.jobs_submit,
                     handler or keep, **kw)
    await c.start()
    out = Collected(c, got)
    out.task = asyncio.create_task(c.run())
    return out


async def dead_letters(bus: Any, n: int, timeout: float = 5.0) -> list[Delivery]:
    """The first ``n`` dead letters of the namespace (fewer if they do not come within ``timeout``)."""
    c = await collect(bus, "dlq-reader", bus.subjects.dlq(">"), stream=bus.subjects.stream_dlq, decoder=raw)
    await until(lambda: len(c.got) >= n, timeout)
    await c.stop()
    return c.got


async def test_both_buses_implement_the_port(bus_factory: MakeBus) -> None:
    bus = await bus_factory()
    assert isinstance(bus, EventBus)
    assert isinstance(bus, JetStreamBus | MemoryBus)


async def test_a_message_published_twice_with_one_id_is_consumed_once(bus_factory: MakeBus) -> None:
    bus = await bus_factory()
    c = await collect(bus, "dedupe")
    first = await bus.publish(bus.subjects.jobs_submit, submit(1))
    again = await bus.publish(bus.subjects.jobs_submit, submit(1))
    await bus.publish_batch([Outgoing(bus.subjects.jobs_submit, submit(i)) for i in range(2, 300)])
    assert not first.duplicate and again.duplicate and again.seq == first.seq
    assert await until(lambda: len(c.got) >= 299)
    await asyncio.sleep(0.1)
    await c.stop()
    assert sorted(d.data.job_id for d in c.got) == sorted(f"j{i}" for i in range(1, 300))


async def test_a_batch_is_acknowledged_per_message_by_the_stream(bus_factory: MakeBus) -> None:
    bus = await bus_factory()
    subj = bus.subjects.jobs_submit
    acks = await bus.publish_batch([Outgoing(subj, submit(i)) for i in range(5)])
    assert [a.stream for a in acks] == [bus.subjects.stream_jobs] * 5
    assert [a.seq for a in acks] == list(range(acks[0].seq, acks[0].seq + 5)) and not any(a.duplicate for a in acks)
    again = await bus.publish_batch([Outgoing(subj, submit(3)), Outgoing(subj, submit(9))])
    assert [(a.seq, bool(a.duplicate)) for a in again] == [(acks[3].seq, True), (acks[4].seq + 1, False)]


async def test_a_publish_that_no_stream_takes_is_refused(bus_factory: MakeBus) -> None:
    bus = await bus_factory()
    with pytest.raises(BusError, match="no stream acknowledged"):
        await bus.publish_batch([Outgoing(f"{bus.subjects.namespace}-nostream.x", submit(1))])
    with pytest.raises(BusError):
        await bus.publish(f"{bus.subjects.namespace}-nostream.x", submit(2))


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'{"id": "x", "job_id": ', "malformed JSON"),
        (b'{"id": "x", "job_id": "a b", "demand": {"profile": "1g.5gb"}, "submitted_at": 1}', "$.job_id"),
        (b'{"id": "x", "job_id": "j", "priority": 5000, "demand": {"profile": "1g.5gb"}, "submitted_at": 1}',
         "$.priority"),
        (b'{"id": "x", "job_id": "j", "demand": {"profile": "9g.99gb"}, "submitted_at": 1}', "unknown profile"),
        (b'{"id": "x", "job_id": "j", "demand": {"profile": "1g.5gb", "compute_slices": 1}, "submitted_at": 1}',
         "invalid demand"),
    ],
)
async def test_an_invalid_submit_is_dead_lettered_with_its_reason_and_never_reaches_the_handler(
    bus_factory: MakeBus, payload: bytes, reason: str
) -> None:
    bus = await bus_factory()
    c = await collect(bus, "strict")
    await bus.publish_raw(bus.subjects.jobs_submit, payload, {"Nats-Msg-Id": "bad-1"})
    await bus.publish(bus.subjects.jobs_submit, submit(7))
    dead = await dead_letters(bus, 1)
    assert await until(lambda: len(c.got) == 1)
    await c.stop()
    assert len(dead) == 1
    h = dead[0].headers
    assert reason in h["Migsched-Error"]
    assert h["Migsched-Original-Subject"] == bus.subjects.jobs_submit
    assert h["Migsched-Original-Msg-Id"] == "bad-1" and "Nats-Msg-Id" in h
    assert dead[0].data == payload
    assert [d.data.job_id for d in c.got] == ["j7"]


async def test_a_message_that_keeps_failing_is_dead_lettered_after_max_deliveries(bus_factory: MakeBus) -> None:
    bus = await bus_factory(max_deliver=3)
    seen: list[int] = []

    async def flaky(ds: list[Delivery]) -> None:
        for d in ds:
            seen.append(d.deliveries)
            d.retry("downstream unavailable")

    c = await collect(bus, "flaky", handler=flaky, retry_delay_s=0.01)
    await bus.publish(bus.subjects.jobs_submit, submit(1))
    dead = await dead_letters(bus, 1, timeout=10)
    await c.stop()
    assert seen == [1, 2, 3]
    assert "downstream unavailable" in dead[0].headers["Migsched-Error"]
    assert dead[0].headers["Migsched-Deliveries"] == "3"


async def test_a_handler_that_raises_gets_the_batch_again(bus_factory: MakeBus) -> None:
    bus = await bus_factory()
    calls: list[int] = []

    async def crashes_once(ds: list[Delivery]) -> None:
        calls.append(len(ds))
        if len(calls) == 1:
            raise RuntimeError("boom")

    c = await collect(bus, "crashy", handler=crashes_once, retry_delay_s=0.01)
    await bus.publish(bus.subjects.jobs_submit, submit(1))
    assert await until(lambda: len(calls) >= 2)
    await c.stop()
    assert await dead_letters(bus, 1, timeout=0.5) == []


async def test_an_unacknowledged_message_comes_back_after_the_ack_wait(bus_factory: MakeBus) -> None:
    bus = await bus_factory(ack_wait_s=0.5)
    c = bus.consumer(bus.subjects.stream_jobs, "slow", bus.subjects.jobs_submit, lambda ds: asyncio.sleep(0))
    await c.start()
    await bus.publish(bus.subjects.jobs_submit, submit(1))
    sub = c._sub
    assert sub is not None
    first = await sub.next_batch(5.0)  # taken, and never settled: as if the consumer died holding it
    assert [m.deliveries for m in first] == [1]
    again = await sub.next_batch(5.0)
    assert [(m.data, m.deliveries) for m in again] == [(first[0].data, 2)]
    await again[0].ack()
    assert await sub.next_batch(1.0) == []
    await sub.stop()


async def test_the_stream_reads_back_a_subject_from_a_time_on_up_to_a_sequence(bus_factory: MakeBus) -> None:
    bus = await bus_factory()
    subj = bus.subjects.jobs_submit
    await bus.publish(subj, submit(0))
    await asyncio.sleep(1.1)  # JetStream's start time is read to the second or finer: leave a clear gap
    since = time.time()
    acks = await bus.publish_batch([Outgoing(subj, submit(i)) for i in range(1, 6)])
    await bus.publish(bus.subjects.jobs_cancel, JobCancel(id="c-1", job_id="j1", reason="x", at=now()))
    got = await bus.stored(bus.subjects.stream_jobs, subj, since, acks[3].seq, limit=100)
    assert [m.seq for m in got] == [a.seq for a in acks[:4]]  # not the earlier one, nor past the sequence
    assert [decode_submit(m.data).job_id for m in got] == ["j1", "j2", "j3", "j4"]
    assert all(m.subject == subj and since - 1 <= m.at <= time.time() + 1 for m in got)
    assert got[0].headers.get("Nats-Msg-Id") == "m-1"
    assert len(await bus.stored(bus.subjects.stream_jobs, subj, since, acks[-1].seq, limit=2)) == 2


async def test_a_durable_consumer_tells_its_leader_and_how_far_it_delivered(bus_factory: MakeBus) -> None:
    bus = await bus_factory()
    assert await bus.consumer_lead(bus.subjects.stream_jobs, "nobody") is None
    c = await collect(bus, "led")
    acks = await bus.publish_batch([Outgoing(bus.subjects.jobs_submit, submit(i)) for i in range(3)])
    assert await until(lambda: len(c.got) >= 3)
    await c.stop()
    lead = await bus.consumer_lead(bus.subjects.stream_jobs, "led")
    assert lead is not None and lead.leader
    assert lead.delivered_seq == acks[-1].seq


async def test_replicas_of_one_durable_share_the_messages(bus_factory: MakeBus) -> None:
    bus = await bus_factory()
    a = await collect(bus, "shared-work")
    b = await collect(bus, "shared-work")
    await bus.publish_batch([Outgoing(bus.subjects.jobs_submit, submit(i)) for i in range(200)])
    assert await until(lambda: len(a.got) + len(b.got) >= 200)
    await asyncio.sleep(0.2)
    await a.stop()
    await b.stop()
    ids = [d.data.job_id for d in a.got + b.got]
    assert sorted(ids) == sorted(f"j{i}" for i in range(200))  # each once, whichever replica took it


async def test_each_ephemeral_consumer_sees_every_message_published_after_it_was_made(bus_factory: MakeBus) -> None:
    bus = await bus_factory()
    await bus.publish(bus.subjects.jobs_submit, submit(0))  # before: neither sees it
    a = await collect(bus, "mirror", ephemeral=True, acks=False, lost=lambda reason: None)
    b = await collect(bus, "mirror", ephemeral=True, acks=False, lost=lambda reason: None)
    assert a.consumer.durable != b.consumer.durable
    for i in range(1, 6):
        await bus.publish(bus.subjects.jobs_submit, submit(i))
    assert await until(lambda: len(a.got) == 5 and len(b.got) == 5)
    await a.stop()
    await b.stop()
    for c in (a, b):
        assert [d.data.job_id for d in c.got] == [f"j{i}" for i in range(1, 6)]


async def test_the_trace_context_travels_in_the_headers(bus_factory: MakeBus) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("test")
    bus = await bus_factory()
    c = await collect(bus, "traced")
    with tracer.start_as_current_span("submit") as span:
        trace_id = span.get_span_context().trace_id
        await bus.publish(bus.subjects.jobs_submit, submit(1))
    assert await until(lambda: len(c.got) == 1)
    await c.stop()
    assert c.got[0].headers["traceparent"].split("-")[1] == f"{trace_id:032x}"
    assert trace.get_current_span(c.got[0].ctx).get_span_context().trace_id == trace_id


async def test_a_consumer_without_acks_gets_each_message_once(bus_factory: MakeBus) -> None:
    bus = await bus_factory(ack_wait_s=0.5)
    lost: list[str] = []
    c = await collect(bus, "hints", acks=False, lost=lost.append)
    for i in range(5):
        await bus.publish(bus.subjects.jobs_submit, submit(i))
    assert await until(lambda: len(c.got) == 5)
    await asyncio.sleep(1.0)  # twice the ack wait: an acknowledging consumer would have had them again by now
    await c.stop()
    assert sorted(d.data.job_id for d in c.got) == [f"j{i}" for i in range(5)]
    assert lost == []


async def test_a_failed_batch_without_acks_is_reported_lost_and_not_redelivered(bus_factory: MakeBus) -> None:
    bus = await bus_factory(ack_wait_s=0.5)
    calls: list[int] = []
    lost: list[str] = []

    async def crashes(ds: list[Delivery]) -> None:
        calls.append(len(ds))
        raise RuntimeError("mirror broke")

    c = await collect(bus, "fragile", handler=crashes, acks=False, lost=lost.append)
    await bus.publish(bus.subjects.jobs_submit, submit(1))
    assert await until(lambda: bool(lost))
    await asyncio.sleep(1.0)
    await c.stop()
    assert calls == [1]  # not redelivered
    assert len(lost) == 1 and "mirror broke" in lost[0]
    assert await dead_letters(bus, 1, timeout=0.5) == []


async def test_an_undecodable_message_without_acks_is_still_dead_lettered(bus_factory: MakeBus) -> None:
    bus = await bus_factory()
    c = await collect(bus, "hints-dlq", acks=False, lost=lambda reason: None)
    await bus.publish_raw(bus.subjects.jobs_submit, b"{not json", {"Nats-Msg-Id": "bad-2"})
    dead = await dead_letters(bus, 1)
    await c.stop()
    assert len(dead) == 1 and dead[0].data == b"{not json" and c.got == []


async def test_a_deleted_durable_starts_again_from_the_first_message(bus_factory: MakeBus) -> None:
    bus = await bus_factory()
    await bus.publish_batch([Outgoing(bus.subjects.jobs_submit, submit(i)) for i in range(3)])
    first = await collect(bus, "retired")
    assert await until(lambda: len(first.got) == 3)
    await first.stop()
    await bus.delete_consumer(bus.subjects.stream_jobs, "retired")
    await bus.delete_consumer(bus.subjects.stream_jobs, "never-made")  # nothing to delete is no fault
    second = await collect(bus, "retired")
    assert await until(lambda: len(second.got) == 3)
    await second.stop()


async def test_one_poll_handles_one_batch(bus_factory: MakeBus) -> None:
    bus = await bus_factory()
    got: list[str] = []

    async def keep(ds: list[Delivery]) -> None:
        got.extend(d.data.job_id for d in ds)

    c = bus.consumer(bus.subjects.stream_jobs, "stepped", bus.subjects.jobs_submit, keep, batch=2)
    await c.start()
    await bus.publish_batch([Outgoing(bus.subjects.jobs_submit, submit(i)) for i in range(3)])
    assert await c.poll(5.0) == 2 and got == ["j0", "j1"]
    assert await c.poll(5.0) == 1 and got == ["j0", "j1", "j2"]
    assert await c.poll(0.2) == 0


def test_a_consumer_without_acks_must_say_what_to_do_when_a_batch_is_lost() -> None:
    from services.common.testing import make_settings

    bus = MemoryBus(make_settings("x", "nats://unused", "redis://unused"))

    async def handler(ds: list[Delivery]) -> None:
        return None

    with pytest.raises(ValueError, match="lost"):
        Consumer(bus, "S", "d", "x.jobs.exit", handler, acks=False)


async def test_the_bus_counts_what_it_published_and_how_each_consumed_message_ended(bus_factory: MakeBus) -> None:
    from prometheus_client import REGISTRY

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    bus = await bus_factory()
    durable = f"metered-{bus.subjects.namespace}"  # a label of this test's own
    published = sample("migsched_messages_published_total", kind="JobSubmit")
    c = await collect(bus, durable)
    await bus.publish_batch([Outgoing(bus.subjects.jobs_submit, submit(i)) for i in range(3)])
    await bus.publish(bus.subjects.jobs_submit, submit(3))
    await bus.publish_raw(bus.subjects.jobs_submit, b"{not json", {"Nats-Msg-Id": "bad-3"})
    assert await until(lambda: sample("migsched_consumer_messages_total", consumer=durable, outcome="dead") == 1)
    await c.stop()
    assert sample("migsched_messages_published_total", kind="JobSubmit") == published + 4
    assert sample("migsched_consumer_messages_total", consumer=durable, outcome="ack") == 4
    assert sample("migsched_consumer_batch_size_count", consumer=durable) >= 1


async def test_an_outage_blames_no_message_the_consumer_waits_and_nothing_is_dead_lettered(
    bus_factory: MakeBus,
) -> None:
    from shared.errors import Unavailable

    bus = await bus_factory(max_deliver=2)
    calls: list[list[str]] = []

    async def redis_down_for_a_while(ds: list[Delivery]) -> None:
        calls.append([d.data.job_id for d in ds])
        if len(calls) <= 4:  # twice max_deliver: a message at fault would be dead-lettered long before
            raise Unavailable("Redis is failing over")

    c = await collect(bus, "patient", handler=redis_down_for_a_while, retry_delay_s=0.02,
                      outage=lambda exc: isinstance(exc, Unavailable))
    await bus.publish(bus.subjects.jobs_submit, submit(1))
    assert await until(lambda: len(calls) >= 5, timeout=20)
    assert c.consumer.pause_s == 0.0  # the handler succeeded: the consumer takes messages again at once
    await c.stop()
    assert calls[-1] == ["j1"] and all(batch == ["j1"] for batch in calls)
    assert await dead_letters(bus, 1, timeout=0.5) == []
