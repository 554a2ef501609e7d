"""``jobs.cancel``: the cancel transition; a job that is placed or running gets a ``stop`` command on its node.

A cancel the consumer ``partitioner-cancel`` skipped across a change of its leader (``services.common.read_back``)
is applied when read back, if the state shows it was not: the job has no record (a cancel leaves a tombstone), or
is not ended and not flagged for cancelling.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from opentelemetry import context as otel_context

from services.common.read_back import ReadBack
from services.common.service import Context
from services.registry import metrics as m
from shared import telemetry
from shared.bus import Delivery, Outgoing
from shared.events import Command, JobCancel
from shared.state.model import TERMINAL_STATES

CONSUMER = "partitioner-cancel"


class Cancels:
    def __init__(self, ctx: Context) -> None:
        self.state = ctx.state
        self.bus = ctx.bus
        self.log = ctx.log
        self.subjects = ctx.bus.subjects
        self.read_back = ReadBack(self.bus, self.subjects.stream_jobs, CONSUMER, self.subjects.jobs_cancel,
                                  grace_s=2 * ctx.settings.ack_wait_s)

    async def on_cancel(self, ds: list[Delivery]) -> None:
        await self.apply([(d.data, d.ctx) for d in ds])

    async def apply(self, cancels: Sequence[tuple[JobCancel, otel_context.Context | None]]) -> None:
        now = time.time()
        b = self.state.batch()
        for c, _ in cancels:
            b.cancel(c.job_id, c.reason or "cancelled by request", now)
        out: list[Outgoing] = []
        for (c, ctx), res in zip(cancels, await b.run(), strict=True):
            if res.status == "stop" and res.node:
                cid = f"stop:{c.job_id}"
                out.append(
                    Outgoing(
                        self.subjects.cmd(res.node),
                        Command(
                            id=cid,
                            cmd_id=cid,
                            kind="stop",
                            node=res.node,
                            gpu_id=res.gpu_id or None,
                            instance_id=res.instance_id or None,
                            job_id=c.job_id,
                            at=now,
                        ),
                        ctx,
                    )
                )
        await self.bus.publish_batch(out)

    async def apply_skipped(self) -> int:
        """Apply the cancels the consumer skipped, once a look back finds any; how many it applied."""
        found = await self.read_back.by_job(JobCancel)
        if not found:
            return 0
        records = await self.state.jobs(list(found))
        skipped = [(found[j].data, telemetry.extract(found[j].stored.headers))
                   for j, rec in zip(found, records, strict=True)
                   if rec is None or not (rec.state in TERMINAL_STATES or rec.cancel)]
        if skipped:
            self.log.warning("%d cancels were skipped by consumer %s when its leader changed, and are applied now: "
                             "%s", len(skipped), CONSUMER, ", ".join(c.job_id for c, _ in skipped[:20]))
            await self.apply(skipped)
            m.MISSED_CANCELS.inc(len(skipped))
        return len(skipped)
