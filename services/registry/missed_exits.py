"""Exit reports the registry's consumer never delivered, applied from the heartbeats that repeat them.

After a NATS server loss moves a stream's leader, a durable consumer can skip a message the stream stored: a job
whose ``job_exit`` was skipped would stay ``running`` with its GPU held for good. Each heartbeat repeats the
node's exit reports of the last seconds (``Heartbeat.exits``). One this process applied (``Reports.applied``) is
passed over; the others are applied, as their reports would have been, to the jobs the state still has running
or migrating. Applying a report twice is harmless (its release finds the job released, by that very report, and
publishes its exit again under the same id), so a report that was only late (the consumers stall together while
the stream elects its leader), or one another registry replica applied, costs a read or a no-op release.
"""

from __future__ import annotations

from services.common.service import Context
from services.registry import metrics as m
from services.registry.reports import Reports
from shared.bus import Delivery

_ACTIVE = frozenset({"running", "migrating"})
"""The states an exit can end (a ``placing`` job's start is not applied yet: the command time-out takes it)."""


class MissedExits:
    def __init__(self, ctx: Context, reports: Reports) -> None:
        self.state = ctx.state
        self.log = ctx.log
        self.reports = reports
        self._applying: set[str] = set()
        """Exits applied from a heartbeat whose batch failed (its ``jobs.exit`` may not be out): the heartbeat
        comes back and they are applied again although their jobs have ended (the release hands the GPU back to
        the report that released it, and the exit goes out again under its id)."""

    async def on_heartbeat(self, ds: list[Delivery]) -> None:
        applied = self.reports.applied
        if self._applying:
            self._applying = {i for i in self._applying if i not in applied}  # applied since, by a report
        told = {e.id: (d, e) for d in ds for e in d.data.exits if e.id not in applied}  # heartbeats repeat them
        if not told:
            return
        records = await self.state.jobs([e.job_id for _, e in told.values()])
        missed: list[Delivery] = []
        for (d, e), rec in zip(told.values(), records, strict=True):
            if e.id in self._applying or (rec is not None and rec.state in _ACTIVE):
                missed.append(Delivery(d.msg, e.report(d.data.node), d.span, d.ctx))  # ``apply`` notes it
            else:
                applied.put(e.id, None)  # nothing for it to end: a heartbeat that lists it again says nothing new
        if not missed:
            return
        for d in missed:
            self.log.warning("exit of %s reported by %s not received; applying it from the node's heartbeat",
                             d.data.job_id, d.data.node)
        m.MISSED_EXITS.inc(len(missed))
        ids = {d.data.id for d in missed}
        self._applying |= ids
        await self.reports.apply(missed)
        self._applying -= ids
