"""``jobs.cancel``: the cancel transition; a job that is placed or running gets a ``stop`` command on its node."""

from __future__ import annotations

import time

from services.common.service import Context
from shared.bus import Delivery, Outgoing
from shared.events import Command


class Cancels:
    def __init__(self, ctx: Context) -> None:
        self.state = ctx.state
        self.bus = ctx.bus
        self.subjects = ctx.bus.subjects

    async def on_cancel(self, ds: list[Delivery]) -> None:
        now = time.time()
        b = self.state.batch()
        for d in ds:
            b.cancel(d.data.job_id, d.data.reason or "cancelled by request", now)
        out: list[Outgoing] = []
        for d, res in zip(ds, await b.run(), strict=True):
            if res.status == "stop" and res.node:
                cid = f"stop:{d.data.job_id}"
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
                            job_id=d.data.job_id,
                            at=now,
                        ),
                        d.ctx,
                    )
                )
        await self.bus.publish_batch(out)
