"""One job is one trace: the W3C context travels in NATS headers from the submit through the balancer (which
sends the command itself) to the executor's command consumer."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings
from shared import telemetry
from shared.events import Demand, JobSubmit, now

pytestmark = [pytest.mark.integration, pytest.mark.timeout(40)]


async def test_the_submit_the_decision_and_the_command_share_one_trace(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    exporter = InMemorySpanExporter()
    telemetry.setup("migsched-test", exporter=exporter, synchronous=True)
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url)
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=1)
        await ex.start()
        for _ in range(100):
            if len(stack.balancer.mirrors[0]):
                break
            await asyncio.sleep(0.05)
        with telemetry.tracer("test").start_as_current_span("client submit") as root:
            trace_id = root.get_span_context().trace_id
            await ns.bus.publish(
                ns.bus.subjects.jobs_submit,
                JobSubmit(
                    id="s-1", job_id="traced", demand=Demand(kind="mig", profile="1g.5gb"), submitted_at=now()
                ),
            )
        for _ in range(200):
            if ex.commands("place"):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        await ex.stop()
        await stack.stop()
    spans = [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]
    names = {s.name for s in spans}
    s = ns.bus.subjects
    assert f"{s.jobs_submit} process" in names  # balancer
    assert f"{s.sched_placed} process" not in names  # no registry hop: the balancer sent the command
    assert f"{s.cmd('n1')} process" in names  # executor
    decision = next(sp for sp in spans if sp.name == f"{s.jobs_submit} process")
    assert "traced -> n1/0 1g.5gb" in str(decision.attributes.get("migsched.decision"))
    assert decision.kind == trace.SpanKind.CONSUMER
    assert decision.attributes.get("migsched.ops") == 2  # create_gi + create_ci, planned in the balancer
    command = next(sp for sp in spans if sp.name == f"{s.cmd('n1')} process")
    assert command.parent is not None and command.parent.span_id == decision.context.span_id
