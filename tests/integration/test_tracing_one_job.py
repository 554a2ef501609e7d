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

from services.common.testing import Namespace, Stack, make_settings
from services.executor.service import Executor, ExecutorSettings, build_backend
from shared import telemetry
from shared.client import MigschedClient
from shared.settings import load

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NODE = "trace-node"


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    telemetry.setup("migsched-test", exporter=exporter, synchronous=True)
    return exporter


@pytest.fixture
async def stack(prefix: str, nats_url: str, redis_url: str) -> AsyncIterator[tuple[Stack, Executor]]:
    async with Namespace(make_settings(prefix, nats_url, redis_url)):
        services = Stack(prefix, nats_url, redis_url, planner=True)
        await services.start()
        st = load(
            ExecutorSettings,
            env={},
            nats_url=nats_url,
            redis_url=redis_url,
            namespace=prefix,
            stream_storage="memory",
            node=NODE,
            executor_gpus="A100-40GB:2",
            metrics_port=0,
            executor_reconfig_latency_s=0.001,
            heartbeat_s=0.5,
        )
        from shared.bus import JetStreamBus

        bus = await JetStreamBus.connect(st)
        executor = Executor(bus, build_backend(st, NODE), st, NODE)
        await executor.start()
        try:
            yield services, executor
        finally:
            await executor.stop()
            await executor.backend.close()
            await bus.close()
            await services.stop()


async def _wait_for(pred: object, timeout: float = 15.0) -> None:
    async def loop() -> None:
        while not pred():  # type: ignore[operator]
            await asyncio.sleep(0.05)

    await asyncio.wait_for(loop(), timeout)


async def test_one_job_is_one_trace_across_every_service(
    spans: InMemorySpanExporter, stack: tuple[Stack, Executor], prefix: str, nats_url: str, redis_url: str
) -> None:
    _, executor = stack
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
        "balancer-exit",
        "planner-exit",
    )

    def missing() -> list[str]:
        seen = consumers_of(trace_id)
        return [w for w in want if not any(c == w or c.startswith(w + "-") for c in seen)]

    # the last hops' spans end when their batch is acked: give them a moment, then compare
    with contextlib.suppress(asyncio.TimeoutError):
        await _wait_for(lambda: not missing(), timeout=10)
    assert missing() == [], consumers_of(trace_id)
    names = {s.name for s in spans.get_finished_spans() if s.context.trace_id == trace_id}
    assert {"executor place", "executor job exit"} <= names
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
