"""What the executor knows of the workloads it started: shared by applying commands and reporting exits."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from opentelemetry import context as otel_context


@dataclass(slots=True)
class Runs:
    ctx: dict[str, otel_context.Context] = field(default_factory=dict)
    """Job -> the trace context of the command that started it: its exit continues that trace."""
    started: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    """Job -> (monotonic start, duration asked): a move keeps the rest of the run."""
    start_reported: dict[str, asyncio.Event] = field(default_factory=dict)
    """Job -> set once its place's ``cmd_done`` is out: an exit never overtakes its start report."""
    instance: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    """Job -> (instance id, GPU index, GI id) it runs on: its exit names it, so a late exit is recognised as
    stale."""
    started_by: dict[str, str] = field(default_factory=dict)
    """Job -> the id of the command that started its run here (a stop of another command's run leaves it)."""
    retired: set[str] = field(default_factory=set)
    """Jobs whose local copy was stopped by ``migrate_stop`` or a preemption: that stop is not an exit."""

    def forget(self, job_id: str) -> None:
        self.ctx.pop(job_id, None)
        self.started.pop(job_id, None)
        self.instance.pop(job_id, None)
        self.started_by.pop(job_id, None)
