"""What each node's last heartbeat said it runs: the jobs, and the command that started each run.

The registry holds the state against what nodes run every quarter command time-out: one ``look`` (the listed
runs and, in one read, their jobs' records) is judged by ``stray_runs`` and by ``stalled_moves``. A node silent
for twice the command time-out is lost or gone, and what it ran is its resync's to stop, so its list is dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from shared.bus import Delivery
from shared.ports import StateStore
from shared.state.model import JobRecord

CHECK_MAX = 50_000
"""Runs a sweep looks at, at most (the nodes' lists are bounded by the heartbeat schema)."""


class ListedRun(NamedTuple):
    node: str
    job: str
    started_by: str
    """The command that started the run, where the node named it; '' where it did not."""
    heard: float
    """When the heartbeat that listed it was received (``ListedRuns.clock``)."""


class Look(NamedTuple):
    now: float
    """``ListedRuns.clock`` at the look."""
    runs: list[ListedRun]
    records: dict[str, JobRecord | None]
    """Each listed run's job as the state holds it (None: gone)."""


class _Listing(NamedTuple):
    heard: float
    running: tuple[str, ...]
    started: dict[str, str]


class ListedRuns:
    def __init__(self, grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace_s = grace_s
        self.clock = clock
        self._by_node: dict[str, _Listing] = {}

    def on_heartbeat(self, ds: list[Delivery]) -> None:
        now = self.clock()
        for d in ds:
            hb = d.data
            self._by_node[hb.node] = _Listing(now, tuple(hb.running), {r.job_id: r.cmd_id for r in hb.started})

    def current(self) -> list[ListedRun]:
        """Every run the nodes heard from lately list (at most ``CHECK_MAX``)."""
        now = self.clock()
        self._by_node = {n: lst for n, lst in self._by_node.items() if now - lst.heard < 2 * self.grace_s}
        return [ListedRun(node, job, lst.started.get(job, ""), lst.heard)
                for node, lst in self._by_node.items() for job in lst.running][:CHECK_MAX]

    async def look(self, state: StateStore) -> Look:
        """The runs listed now, with their jobs' records read in one go."""
        now = self.clock()
        runs = self.current()
        jobs = sorted({r.job for r in runs})
        return Look(now, runs, dict(zip(jobs, await state.jobs(jobs), strict=True)) if jobs else {})


class Overdue:
    """Findings that have held for a grace: one judged at a sweep, and judged again from a heartbeat heard at
    least ``grace_s`` later, is due; then again once per grace while it holds. A finding not judged at a sweep is
    forgotten (its run ended, or the state caught up)."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._since: dict[tuple[str, ...], float] = {}
        self._next: dict[tuple[str, ...], float] = {}

    def check(self, key: tuple[str, ...], heard: float, now: float) -> float | None:
        """How long ``key`` has held when it is due now; None while it is not."""
        first = self._since.get(key)
        if first is None or heard - first < self.grace_s:
            self._next[key] = now if first is None else first
            return None
        self._next[key] = now
        return heard - first

    def settle(self) -> None:
        """End of a sweep: what it judged is what the next one remembers."""
        self._since, self._next = self._next, {}
