"""Pauses of a service process, as metrics and as warnings: event-loop stalls and garbage collections.

A message waits for as long as its service's event loop is busy elsewhere: a long callback, a full garbage
collection, a process the OS did not run. The submit -> command tail is made of such pauses, and they are
invisible in per-batch timings. Each process watches its own loop (a sleeper that notes how late it wakes)
and its collections (``gc.callbacks``); a pause past ``STALL_LOG_S`` is logged at WARNING with the
process's monotonic clock (``mono=``: the clock ``load`` stamps job timelines with, so a slow window of a
load run can be matched to the pause that made it) and every pause goes into a histogram.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Histogram

STALL_LOG_S = 0.02
"""Pauses at least this long are logged (a p99 budget of 50 ms cannot afford many of them)."""

WATCH_INTERVAL_S = 0.05

LOOP_STALL_SECONDS = Histogram(
    "migsched_loop_stall_seconds",
    "How late the event loop woke a sleeper (time it spent elsewhere: callbacks, collections, not scheduled)",
    ["service"],
    buckets=(1e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.25, 0.5, 1.0),
)
GC_PAUSE_SECONDS = Histogram(
    "migsched_gc_pause_seconds",
    "Duration of one garbage collection, by generation",
    ["service", "generation"],
    buckets=(1e-4, 1e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.25, 1.0),
)

log = logging.getLogger("migsched.stalls")


def describe(service: str, kind: str, seconds: float, mono: float) -> str:
    """The one-line warning; ``load.live`` parses it back (``parse``)."""
    return f"stall service={service} kind={kind} ms={seconds * 1e3:.1f} mono={mono:.3f}"


def parse(line: str) -> tuple[str, str, float, float] | None:
    """``(service, kind, ms, mono)`` of a line holding ``describe``'s text, else None."""
    at = line.find("stall service=")
    if at < 0:
        return None
    try:
        fields = dict(part.split("=", 1) for part in line[at + len("stall ") :].split())
        return fields["service"], fields["kind"], float(fields["ms"]), float(fields["mono"])
    except (KeyError, ValueError):
        return None


class GcPauses:
    """A ``gc.callbacks`` entry timing each collection."""

    def __init__(self, service: str, clock: Callable[[], float] = time.monotonic,
                 log_over_s: float = STALL_LOG_S) -> None:
        self.service = service
        self.clock = clock
        self.log_over_s = log_over_s
        self._started = 0.0
        self._children = {g: GC_PAUSE_SECONDS.labels(service, str(g)) for g in range(3)}

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self.clock()
            return
        now = self.clock()
        took = now - self._started
        generation = int(info.get("generation", 2))
        self._children[generation].observe(took)
        if took >= self.log_over_s:
            log.warning("%s collected=%s", describe(self.service, f"gc{generation}", took, now),
                        info.get("collected", 0))

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def uninstall(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


async def watch_loop(service: str, interval_s: float = WATCH_INTERVAL_S, log_over_s: float = STALL_LOG_S,
                     clock: Callable[[], float] = time.monotonic) -> None:
    """Sleep ``interval_s`` over and over; how much later than asked the loop woke is its stall."""
    child = LOOP_STALL_SECONDS.labels(service)
    while True:
        asked = clock() + interval_s
        await asyncio.sleep(interval_s)
        now = clock()
        late = max(0.0, now - asked)
        child.observe(late)
        if late >= log_over_s:
            log.warning(describe(service, "loop", late, now))
