"""Exit reports the registry's consumer never delivered, applied from the heartbeats that repeat them.

After a NATS server loss moves a stream's leader, a durable consumer can skip a message the stream stored: a job
whose ``job_exit`` was skipped would stay ``running`` with its GPU held for good. Each heartbeat repeats the
node's exit reports of the last seconds (``Heartbeat.exits``). One this process applied (``Reports.applied``) is
passed over. Any other waits here until it is overdue: this process has applied a later report of the same node
(reports of a node come in the order it sent them, so the consumer went past it), or ``grace_s`` went by (time
for a delivered report to come back twice). An overdue exit is applied, as its report would have been, when the
state still has its job running or migrating. A report that is only late, because the consumer lags behind a
burst, is thus not taken from the heartbeat; one applied twice all the same (another registry replica applied
it, or the consumer lagged past the grace) is a redelivery like any other: its release finds the job released,
by that very report, and its exit goes out again under the same id.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from services.common.service import Context
from services.registry import metrics as m
from services.registry.reports import Reports
from shared.bus import Delivery
from shared.events import ToldExit

_ACTIVE = frozenset({"running", "migrating"})
"""The states an exit can end (a ``placing`` job's start is not applied yet: the command time-out takes it)."""
WAITING_MAX = 10_000
"""Exits heard of in heartbeats and not applied yet, at most (the oldest go first): a bound against a registry
that lags far behind its nodes."""


class _Told(NamedTuple):
    heard: float
    """When a heartbeat first listed it (``clock``)."""
    exit: ToldExit
    node: str
    via: Delivery
    """The heartbeat that listed it: its message and trace stand for the report's."""


class MissedExits:
    def __init__(self, ctx: Context, reports: Reports, clock: Callable[[], float] = time.monotonic) -> None:
        self.state = ctx.state
        self.log = ctx.log
        self.reports = reports
        self.clock = clock
        self.grace_s = 2.0 * ctx.settings.ack_wait_s
        self._waiting: dict[str, _Told] = {}
        self._applying: set[str] = set()
        """Exits applied from a heartbeat whose batch failed (its ``jobs.exit`` may not be out): they are
        applied again at the next heartbeat although their jobs have ended (the release hands the GPU back to
        the report that released it, and the exit goes out again under its id)."""

    async def on_heartbeat(self, ds: list[Delivery]) -> None:
        applied = self.reports.applied
        now = self.clock()
        for d in ds:
            for e in d.data.exits:
                if e.id not in applied and e.id not in self._waiting:
                    self._waiting[e.id] = _Told(now, e, d.data.node, d)
        while len(self._waiting) > WAITING_MAX:
            del self._waiting[next(iter(self._waiting))]
        if self._waiting:
            await self._apply_overdue(now)

    async def _apply_overdue(self, now: float) -> None:
        applied, latest = self.reports.applied, self.reports.latest
        due: list[_Told] = []
        for rid, t in list(self._waiting.items()):
            if rid in applied and rid not in self._applying:
                del self._waiting[rid]  # its report came
            elif rid in self._applying or latest.get(t.node, 0.0) > t.exit.at or now - t.heard >= self.grace_s:
                due.append(t)
        if not due:
            return
        records = await self.state.jobs([t.exit.job_id for t in due])
        missed: list[Delivery] = []
        for t, rec in zip(due, records, strict=True):
            if t.exit.id in self._applying or (rec is not None and rec.state in _ACTIVE):
                missed.append(Delivery(t.via.msg, t.exit.report(t.node), t.via.span, t.via.ctx))
            else:
                del self._waiting[t.exit.id]  # nothing for it to end
                applied.put(t.exit.id, None)
        if not missed:
            return
        for d in missed:
            self.log.warning("exit of %s reported by %s not received; applying it from the node's heartbeat",
                             d.data.job_id, d.data.node)
        m.MISSED_EXITS.inc(len(missed))
        ids = {d.data.id for d in missed}
        self._applying |= ids
        await self.reports.apply(missed)  # notes them in ``applied``
        self._applying -= ids
        for rid in ids:
            self._waiting.pop(rid, None)
