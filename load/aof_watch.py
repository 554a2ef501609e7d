"""When Redis rewrote its append-only file during a load run, and what the rewrites cost.

A rewrite forks a child that writes the whole dataset; on a small machine that child takes a core from the
stack for as long as it runs, and the scheduler's latency shows it as a burst (``python -m load.timelines``).
Redis's own counters say how many rewrites there were, not when: this thread polls ``INFO persistence`` and
notes each rewrite's start and end, so a burst in the timeline can be matched with a rewrite, or ruled out.
The children's CPU comes from ``/proc`` (``cutime + cstime`` of redis-server: reaped children only). Every
``memory_every_s`` it also notes Redis's ``used_memory``: whether the dataset levels off (a retention or a cap
on ended jobs at work) or keeps growing, and so makes every rewrite longer than the one before.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

import redis as redis_sync

from load.bench_pipeline import cpu_seconds


@dataclass
class Rewrite:
    start_s: float
    """Seconds after the watch began."""
    end_s: float | None = None


@dataclass
class AofWatch:
    """Polls ``url`` every ``every_s`` from ``start()`` to ``stop()``; ``pid``: redis-server, for child CPU."""

    url: str
    pid: int | None = None
    every_s: float = 0.25
    memory_every_s: float = 30.0
    rewrites: list[Rewrite] = field(default_factory=list)
    memory: list[tuple[float, int]] = field(default_factory=list)
    """(seconds after the watch began, ``used_memory`` in bytes), one per ``memory_every_s``."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = 0.0
    _cpu0: float = 0.0
    _cpu: float = 0.0

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._cpu0 = cpu_seconds(self.pid, children=True) if self.pid else float("nan")
        self._thread = threading.Thread(target=self._run, name="aof-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._cpu = cpu_seconds(self.pid, children=True) - self._cpu0 if self.pid else float("nan")

    def _run(self) -> None:
        r = redis_sync.Redis.from_url(self.url)
        try:
            while True:
                last = self._stop.wait(self.every_s)
                # a poll missed: the next one sees the same rewrite if it is still running
                with contextlib.suppress(redis_sync.RedisError):
                    self.observe(bool(r.info("persistence").get("aof_rewrite_in_progress")))
                    if self.memory_due():
                        self.observe_memory(int(r.info("memory")["used_memory"]))
                if last:
                    return
        finally:
            r.close()

    def observe(self, in_progress: bool) -> None:
        """One poll's answer: opens a rewrite when one runs and none is open, closes the open one otherwise."""
        now = time.monotonic() - self._t0
        open_ = self.rewrites[-1] if self.rewrites and self.rewrites[-1].end_s is None else None
        if in_progress and open_ is None:
            self.rewrites.append(Rewrite(now))
        elif not in_progress and open_ is not None:
            open_.end_s = now

    def memory_due(self) -> bool:
        return not self.memory or time.monotonic() - self._t0 - self.memory[-1][0] >= self.memory_every_s

    def observe_memory(self, used: int) -> None:
        self.memory.append((time.monotonic() - self._t0, used))

    def memory_summary(self) -> str:
        if not self.memory:
            return "redis used_memory: not sampled"
        points = ", ".join(f"{used / 2**20:.0f}" for _, used in self.memory)
        return f"redis used_memory (MiB) every {self.memory_every_s:g} s from the start: {points}"

    def summary(self) -> str:
        head = f"redis AOF rewrites while the scenario ran: {len(self.rewrites)}, children CPU {self._cpu:.1f} s"
        spans = [
            f"{w.start_s:.1f} s ({'running' if w.end_s is None else f'{w.end_s - w.start_s:.1f} s'})"
            for w in self.rewrites
        ]
        return head + (" — began at " + ", ".join(spans) + " after the scenario's start" if spans else "")
