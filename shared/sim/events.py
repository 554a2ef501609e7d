"""Event kinds and the event queue (a binary heap on ``(time, kind, seq)``).

At equal times, kinds run in the order below: exits and completions free resources before arrivals look for
them, the defragmentation tick sees the settled state, and a timeout fires only if nothing placed the job
first.
Stale events (a job's exit that moved because its speed changed) carry an old ``epoch`` and are skipped.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import NamedTuple

EXIT = 0
MIGRATION_DONE = 1
RECONFIG_DONE = 2
ARRIVAL = 3
DEFRAG = 4
TIMEOUT = 5

NAMES = {
    EXIT: "exit",
    MIGRATION_DONE: "migration_done",
    RECONFIG_DONE: "reconfig_done",
    ARRIVAL: "arrival",
    DEFRAG: "defrag",
    TIMEOUT: "timeout",
}


class Event(NamedTuple):
    time: float
    kind: int
    seq: int
    job: int
    """Index of the job in the workload (-1 for the defragmentation tick)."""
    epoch: int


_new = tuple.__new__


class EventQueue:
    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = 0

    @property
    def heap(self) -> list[Event]:
        """The heap itself, for a loop that peeks at its top without a call per event (read only)."""
        return self._heap

    def push(self, time: float, kind: int, job: int = -1, epoch: int = 0) -> None:
        self._seq += 1
        # ``Event(...)`` without its generated ``__new__`` (a Python-level lambda): the same tuple, made in C
        heappush(self._heap, _new(Event, (time, kind, self._seq, job, epoch)))

    def peek_time(self) -> float:
        return self._heap[0].time if self._heap else float("inf")

    def peek_key(self) -> tuple[float, int]:
        if not self._heap:
            return (float("inf"), 99)
        e = self._heap[0]
        return (e.time, e.kind)

    def pop(self) -> Event:
        return heappop(self._heap)

    def __len__(self) -> int:
        return len(self._heap)
