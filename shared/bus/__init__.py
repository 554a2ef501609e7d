"""JetStream bus: streams and durable pull consumers, publishing with dedupe and trace headers, dead-letter.

    bus = await Bus.connect(settings)          # settings: shared.settings.Settings (namespace, URLs, limits)
    await bus.ensure_streams()                 # JOBS, SCHED, CMD, NODE, DLQ (prefixed by the namespace)
    await bus.publish(bus.subjects.jobs_submit, JobSubmit(...))
    c = bus.consumer(bus.subjects.stream_jobs, "my-durable", bus.subjects.jobs_submit, handler)
    await c.start(); task = asyncio.create_task(c.run()); ...; c.stop()

A handler receives ``list[Delivery]`` (decoded ``.data``, trace ``.ctx``) and may call ``d.retry(reason)`` or
``d.dead(reason)``; everything else is acked after it returns.
"""

from shared.bus.connection import Bus, BusError, Outgoing
from shared.bus.consumer import Consumer, Delivery, Handler
from shared.bus.health import BusHealth

__all__ = ["Bus", "BusError", "BusHealth", "Consumer", "Delivery", "Handler", "Outgoing"]
