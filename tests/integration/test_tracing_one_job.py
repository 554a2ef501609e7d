"""One job is one trace: submit (client) -> balancer -> registry -> executor -> the executor's exit report
-> ``jobs.exit`` consumers, with W3C ``traceparent`` carried in NATS headers between every hop.

The services run in this process (against the real NATS and Redis) with an in-memory span exporter; each hop's
consumer span names its durable consumer, which tells which service handled the message.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common.testing import with_sim_executor
from services.executor.service import Executor
from shared import telemetry
from shared.client import MigschedClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NODE = "trace-node"


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    telemetry.setup("migsched-test", exporter=exporter, synchronous=True)
    return exporter


@pytest.fixture
async def stack(prefix: str, nats_url: str, redis_url: str) -> AsyncIterator[Executor]:
    async with with_sim_executor(prefix, nats_url, redis_url, NODE, "A100-40GB:2", planner=True) as executor:
        yield executor


async def _wait_for(pred: object, timeout: float = 15.0) -> None:
    async def loop() -> None:
        while not pred():  # type: ignore[operator]
            await asyncio.sleep(0.05)

    await asyncio.wait_for(loop(), timeout)


async def test_one_job_is_one_trace_across_every_service(
    spans: InMemorySpanExporter, stack: Executor, prefix: str, nats_url: str, redis_url: str
) -> None:
    executor = stack
    await _wait_for(lambda: executor.book.models)  # registered
    async with MigschedClient(nats_url, namespace=prefix, redis_url=redis_url) as client:
        await _wait_for(lambda: True)
        job = await client.submit(profile="1g.5gb", duration_s=0.2)
        assert await client.wait(job, timeout=20) == "finished"

    def consumers_of(trace_id: int) -> set[str]:
        return {
            str(s.attributes.get("messaging.consumer.group.name"))
            for s in spans.get_finished_spans()
            if s.context.trace_id == trace_id
            and s.attributes
            and "messaging.consumer.group.name" in s.attributes
        }

    roots = [
        s
        for s in spans.get_finished_spans()
        if s.name == "submit" and s.attributes and s.attributes.get("migsched.job_id") == job
    ]
    assert len(roots) == 1
    trace_id = roots[0].context.trace_id
    # durable consumers by service (a replica may suffix its name, e.g. balancer-exit-<id>)
    want = (
        "balancer-submit",  # which sends the place command itself
        f"executor-{NODE}",
        "registry-report",
        "planner-exit",
    )

    def missing() -> list[str]:
        seen = consumers_of(trace_id)
        return [w for w in want if not any(c == w or c.startswith(w + "-") for c in seen)]

    # the last hops' spans end when their batch is acked: give them a moment, then compare
    with contextlib.suppress(asyncio.TimeoutError):
        await _wait_for(lambda: not missing(), timeout=10)
    assert missing() == [], consumers_of(trace_id)
    mine = [s for s in spans.get_finished_spans() if s.context.trace_id == trace_id]
    names = {s.name for s in mine}
    assert {"executor place", "executor job exit", "balancer commit", "registry apply reports"} <= names
    # each commit's Redis round trip is a child span of it, naming the transitions it ran
    by_id = {s.context.span_id: s for s in mine}
    redis = [s for s in mine if s.name.startswith("redis ")]
    assert any("reserve" in s.name and by_id[s.parent.span_id].name == "balancer commit" for s in redis if s.parent)
    assert any(s.parent and by_id[s.parent.span_id].name == "registry apply reports" for s in redis)
    # the mirror feeds make no span
    fed = {str(s.attributes.get("messaging.consumer.group.name", "")) for s in spans.get_finished_spans()
           if s.attributes}
    assert not [c for c in fed if c.startswith(("balancer-exit", "balancer-capacity"))]
    # and nothing of this job leaked into another trace
    other = [
        s
        for s in spans.get_finished_spans()
        if s.attributes and s.attributes.get("migsched.job_id") == job and s.context.trace_id != trace_id
    ]
    assert other == []
    # heartbeats came every 0.5 s throughout, and made no span
    assert not [s for s in spans.get_finished_spans()
                if s.attributes and s.attributes.get("messaging.consumer.group.name") == "registry-heartbeat"]


async def test_a_jobs_wait_in_the_queue_is_a_span_of_its_trace_with_the_reason(
    spans: InMemorySpanExporter, stack: Executor, prefix: str, nats_url: str, redis_url: str
) -> None:
    executor = stack
    await _wait_for(lambda: executor.book.models)
    async with MigschedClient(nats_url, namespace=prefix, redis_url=redis_url) as client:
        first = [await client.submit(profile="7g.40gb", duration_s=1.0) for _ in range(2)]  # both GPUs
        await asyncio.sleep(0.3)
        late = await client.submit(profile="7g.40gb", duration_s=0.2)  # waits for one of them
        assert await client.wait(late, timeout=20) == "finished"
        for j in first:
            assert await client.wait(j, timeout=20) == "finished"
    root = next(s for s in spans.get_finished_spans()
                if s.name == "submit" and s.attributes and s.attributes.get("migsched.job_id") == late)
    waits = [s for s in spans.get_finished_spans()
             if s.name == "queue wait" and s.context.trace_id == root.context.trace_id]
    assert len(waits) == 1
    attrs = waits[0].attributes or {}
    assert attrs["migsched.queue.outcome"] == "placed" and attrs["migsched.queue.decisions"] >= 1
    assert "7g.40gb" in str(attrs["migsched.queue.reason"])
    assert 0.3 < float(attrs["migsched.wait_s"]) < 10  # it waited for the first jobs' second, roughly
    early = [dict(s.attributes or {}) for s in spans.get_finished_spans() if s.name == "queue wait"
             and s.attributes and s.attributes.get("migsched.job_id") in first]
    # placed at once, or waiting only for the balancer to hear of the node: nothing else made them wait
    assert all(a["migsched.queue.reason"] == "no GPU in the cluster" for a in early), early
