"""The event bus: streams and consumers of one namespace, on NATS JetStream or in memory.

    bus = await JetStreamBus.connect(settings)  # or MemoryBus(settings); both are a ``shared.ports.EventBus``
    await bus.ensure_streams()                  # JOBS, SCHED, CMD, NODE, DLQ (prefixed by the namespace)
    await bus.publish(bus.subjects.jobs_submit, JobSubmit(...))
    c = bus.consumer(bus.subjects.stream_jobs, "my-durable", bus.subjects.jobs_submit, handler)
    await c.start(); task = asyncio.create_task(c.run()); ...; c.stop()

A handler receives ``list[Delivery]`` (decoded ``.data``, trace ``.ctx``) and may call ``d.retry(reason)`` or
``d.dead(reason)``; everything else is acked after it returns.
"""

from shared.bus.consumer import Consumer, Delivery, Handler
from shared.bus.errors import BusError, SubscriptionClosed
from shared.bus.health import BusHealth
from shared.bus.jetstream import JetStreamBus
from shared.bus.memory import MemoryBus
from shared.bus.outgoing import Outgoing, PublishAck

__all__ = [
    "BusError",
    "BusHealth",
    "Consumer",
    "Delivery",
    "Handler",
    "JetStreamBus",
    "MemoryBus",
    "Outgoing",
    "PublishAck",
    "SubscriptionClosed",
]
