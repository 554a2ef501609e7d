"""Resident memory of the stack's processes over a run (the soak's "memory flat within ±10 %" budget).

RSS comes from ``/proc/<pid>/status`` (``VmRSS``), read every few seconds; processes are named on the command
line (``balancer=1234``) or found by their command line (``python -m services.balancer``,
``migsched service balancer``). Drift compares the median of the last tenth of the samples with the median of
the first tenth after a warm-up, so a single GC spike or a cold start does not decide the verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

SERVICES = ("balancer", "registry", "migration_planner", "executor")


def rss_kib(pid: int, proc: Path = Path("/proc")) -> int | None:
    """VmRSS of ``pid`` in KiB; None when the process is gone."""
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def find_services(proc: Path = Path("/proc")) -> dict[str, int]:
    """``name -> pid`` of running migsched services, by command line (executors numbered by pid order)."""
    found: dict[str, int] = {}
    pids = sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit())
    for pid in pids:
        try:
            argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        for i, w in enumerate(words):
            name = None
            if w.startswith("services.") and w.split(".")[1] in SERVICES:
                name = w.split(".")[1]
            elif w == "service" and i + 1 < len(words) and words[i + 1].replace("-", "_") in SERVICES:
                name = words[i + 1].replace("-", "_")
            if name is not None:
                key = name if name not in found else f"{name}-{pid}"
                found[key] = pid
                break
    return found


class MemoryTrend(msgspec.Struct, frozen=True):
    samples: int
    first_mib: float
    last_mib: float
    max_mib: float
    drift_pct: float
    """(median of the last tenth − median of the first tenth after warm-up) / the latter, in %."""


def trend(samples: list[tuple[float, int]], warmup_s: float = 60.0) -> MemoryTrend | None:
    """Summarize ``(seconds since start, KiB)`` samples; None with fewer than 2 after the warm-up."""
    steady = [kib for t, kib in samples if t >= warmup_s] or [kib for _, kib in samples]
    if len(steady) < 2:
        return None
    tenth = max(1, len(steady) // 10)
    head, tail = statistics.median(steady[:tenth]), statistics.median(steady[-tenth:])
    return MemoryTrend(samples=len(steady), first_mib=round(steady[0] / 1024, 1),
                       last_mib=round(steady[-1] / 1024, 1), max_mib=round(max(steady) / 1024, 1),
                       drift_pct=round(100.0 * (tail - head) / head, 1) if head else 0.0)


@dataclass
class MemorySampler:
    """Samples the RSS of ``pids`` every ``interval_s`` until stopped."""

    pids: dict[str, int]
    interval_s: float = 5.0
    samples: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)
    """Processes that disappeared during the run (a crash is worth a line in the report)."""

    def sample(self, t: float) -> None:
        for name, pid in self.pids.items():
            kib = rss_kib(pid)
            if kib is None:
                self.gone.add(name)
            else:
                self.samples.setdefault(name, []).append((t, kib))

    async def run(self, stop: asyncio.Event) -> None:
        t0 = time.monotonic()
        while not stop.is_set():
            self.sample(time.monotonic() - t0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)

    def trends(self, warmup_s: float) -> dict[str, MemoryTrend | None]:
        return {name: trend(s, warmup_s) for name, s in self.samples.items()}
