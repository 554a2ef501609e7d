"""CPU cost of the generic bus layer per message: publish (``Bus.publish_batch``), then consume, decode, hand
to a no-op handler and ack (``Consumer``), against the real NATS, in a namespace of its own.

It measures this process's CPU time (``time.process_time``), not wall time, so that other work on a shared
machine changes the figure little; NATS's own CPU is not included. Messages carry what the services' messages
carry: ``Nats-Msg-Id`` and a W3C ``traceparent`` (each publish continues the trace of the message consumed).

    .venv/bin/python load/bench_bus.py --messages 20000 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from shared.bus import Bus, Delivery, Outgoing
from shared.events import Demand, JobSubmit
from shared.settings import Settings, load


async def once(n: int, batch: int) -> dict[str, float]:
    ns = "bbus" + uuid.uuid4().hex[:6]
    settings = load(Settings, namespace=ns, stream_storage="memory", metrics_port=0)
    bus = await Bus.connect(settings, name="bench-bus")
    await bus.ensure_streams()
    parent = trace.set_span_in_context(
        NonRecordingSpan(SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, True, TraceFlags(1)))
    )
    msgs = [
        Outgoing(
            bus.subjects.jobs_submit,
            JobSubmit(id=f"s-{i}", job_id=f"j{i}", demand=Demand(kind="mig", profile="1g.5gb"), submitted_at=1.0),
            parent,
        )
        for i in range(n)
    ]
    try:
        t0 = time.process_time()
        for k in range(0, n, batch):
            await bus.publish_batch(msgs[k : k + batch])
        publish_cpu = time.process_time() - t0

        got = 0
        done = asyncio.Event()

        async def handler(ds: list[Delivery]) -> None:
            nonlocal got
            got += len(ds)
            if got >= n:
                done.set()

        c = bus.consumer(bus.subjects.stream_jobs, "bench", bus.subjects.jobs_submit, handler, batch=batch)
        await c.start()
        t0 = time.process_time()
        task = asyncio.create_task(c.run())
        await asyncio.wait_for(done.wait(), 120)
        await bus.nc.flush()  # the acks are out
        consume_cpu = time.process_time() - t0
        c.stop()
        await task
    finally:
        await bus.delete_streams()
        await bus.close()
    return {"publish_us_per_msg": publish_cpu / n * 1e6, "consume_us_per_msg": consume_cpu / n * 1e6}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    runs = [await once(args.messages, args.batch) for _ in range(args.repeat)]
    return {
        "messages": args.messages,
        "batch": args.batch,
        "runs": [{k: round(v, 2) for k, v in r.items()} for r in runs],
        "best": {k: round(min(r[k] for r in runs), 2) for k in runs[0]},
    }


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=64, help="messages per publish_batch and per pull")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(main(args)), indent=2))


if __name__ == "__main__":
    cli()
