"""Submits the stream stored that the balancer's durable consumer went past without delivering them.

A skipped submit leaves nothing behind: no record, no command, no time-out. So the balancer reads back the
submits around each change of ``balancer-submit``'s leader (``services.common.read_back``) and hands on each
whose job the state does not know: a job it placed, queued, rejected or saw cancelled has a record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from services.common.read_back import ReadBack
from shared.events import JobSubmit
from shared.ports import EventBus, StateStore


class Missed(NamedTuple):
    submit: JobSubmit
    spec: bytes
    headers: dict[str, str]


class MissedSubmits:
    """The submits ``durable`` skipped across a change of its leader, once a look back finds them."""

    def __init__(self, bus: EventBus, state: StateStore, stream: str, durable: str, subject: str,
                 grace_s: float, clock: Callable[[], float] = time.time) -> None:
        self.state = state
        self.read_back = ReadBack(bus, stream, durable, subject, grace_s, clock)

    async def poll(self) -> list[Missed]:
        found = await self.read_back.by_job(JobSubmit)
        if not found:
            return []
        ids = list(found)
        records = await self.state.jobs(ids)
        return [Missed(found[j].data, found[j].stored.data, dict(found[j].stored.headers))
                for j, rec in zip(ids, records, strict=True) if rec is None]
