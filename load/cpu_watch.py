"""CPU per process per window during a load run, and how busy the whole machine was.

The totals ``load.live`` prints say what a run cost, not whether the cost moved while it ran: a tail that grows
over a soak is either more work per job later on (one process's share rises) or the same work on a machine
too busy to absorb it (every share flat, the machine near 100 %). This thread reads ``/proc`` every
``every_s`` seconds and keeps, per window, each named process's CPU seconds, the seconds its threads spent
runnable but waiting for a core (the scheduler's run-queue delay, ``/proc/<pid>/task/*/schedstat``: latency
that no profile of the process shows), and the share of all cores that were busy (anything else on the machine
included).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU seconds of a process so far (Linux /proc); ``children``: of its reaped children
    instead (for redis-server, its AOF rewrites)."""
    first = 13 if children else 11
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[first]) + int(fields[first + 1])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (Linux /proc/stat), to see what else ran during the run."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return (sum(f) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


@dataclass(frozen=True)
class Window:
    start_s: float
    """Seconds after the watch began."""
    length_s: float
    busy_pct: float
    """Share of all cores busy in the window (nan when /proc/stat could not be read)."""
    cpu_s: dict[str, float]
    """Name -> CPU seconds in the window (nan for a process that had gone)."""
    wait_s: dict[str, float] = field(default_factory=dict)
    """Name -> seconds its threads waited, runnable, for a core in the window (summed over threads)."""


def run_queue_seconds(pid: int) -> float:
    """Seconds all threads of a process (the live ones) have waited runnable for a core (Linux schedstat). A
    thread that ends takes its share with it, so a window in which one ended reads low (the services' and
    servers' threads live as long as they do)."""
    total = 0.0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return math.nan
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended between the listing and the read
    return total


@dataclass
class CpuWatch:
    """Samples ``pids`` every ``every_s`` from ``start()`` to ``stop()`` (the last, shorter window included)."""

    pids: Mapping[str, int]
    every_s: float = 20.0
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    read_cpu: Callable[[int], float] = cpu_seconds
    read_busy: Callable[[], float] = machine_busy_seconds
    read_wait: Callable[[int], float] = run_queue_seconds
    windows: list[Window] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = 0.0
    _last: tuple[float, float, dict[str, float], dict[str, float]] = (0.0, 0.0, {}, {})

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._last = self._read(0.0)
        self._thread = threading.Thread(target=self._run, name="cpu-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while True:
            last = self._stop.wait(self.every_s)
            self.observe(*self._read(time.monotonic() - self._t0))
            if last:
                return

    def _read(self, at_s: float) -> tuple[float, float, dict[str, float], dict[str, float]]:
        return (at_s, self.read_busy(), {name: self.read_cpu(pid) for name, pid in self.pids.items()},
                {name: self.read_wait(pid) for name, pid in self.pids.items()})

    def observe(self, at_s: float, busy_s: float, cpu: dict[str, float], wait: dict[str, float]) -> None:
        """One sample (seconds since the start, machine busy seconds, name -> CPU seconds so far, name ->
        run-queue seconds so far): closes the window since the previous sample."""
        t0, busy0, cpu0, wait0 = self._last
        length = at_s - t0
        if length <= 0:
            return
        share = 100 * (busy_s - busy0) / (length * self.cores)
        self.windows.append(Window(t0, length, share, {n: cpu[n] - cpu0.get(n, math.nan) for n in cpu},
                                   {n: wait[n] - wait0.get(n, math.nan) for n in wait}))
        self._last = (at_s, busy_s, cpu, wait)

    def table(self, what: Literal["cpu", "wait"] = "cpu") -> str:
        """The windows as a Markdown table, one column per process: CPU seconds (``cpu``) or seconds waiting
        for a core (``wait``)."""
        col = [w.cpu_s if what == "cpu" else w.wait_s for w in self.windows]
        names = sorted({n for c in col for n in c})
        head = ["| from (s) | machine busy % | " + " | ".join(names) + " |",
                "|---:|---:|" + "---:|" * len(names)]
        rows = [
            f"| {w.start_s:.0f} | {_fmt(w.busy_pct, 1)} | "
            + " | ".join(_fmt(c.get(n, math.nan), 2) for n in names) + " |"
            for w, c in zip(self.windows, col, strict=True)
        ]
        return "\n".join(head + rows)


def _fmt(x: float, digits: int) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"
