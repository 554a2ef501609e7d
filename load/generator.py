"""Open-loop load: JobSubmits on ``jobs.submit`` at their scheduled instants, however the system copes.

Coordinated omission is what makes most load tests lie: a generator that waits for the system (awaits each
publish acknowledgement, or sends "as fast as it can") stops offering load exactly when the system is slow,
and then measures only the lucky requests. Here every message has an *intended* send instant fixed in
advance by the schedule (``steady``, ``phased``, ``from_trace``). The loop sleeps only while it is ahead of
the schedule; when it falls behind it sends the backlog at once, without shifting later instants. Latencies
are measured from the intended instant, so a stall on our side or the system's shows up as latency, not as a
quietly lower rate. Acknowledgements are collected asynchronously (one wildcard inbox, no per-message wait),
and ``send_lag`` (actual minus intended send instant) tells whether the generator itself kept up.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec
from hdrh.histogram import HdrHistogram

from shared.errors import MigschedError
from shared.events import JobSubmit, Subjects, encode
from shared.policy.request import Demand

Schedule = Iterable[float]
"""Intended send instants, in seconds after the start, non-decreasing."""


class LoadError(MigschedError):
    """A load run is misconfigured (bad rate, unreadable trace, unknown scenario)."""


def steady(rate: float, duration_s: float) -> Iterator[float]:
    """``rate`` arrivals per second for ``duration_s`` seconds: instant i is exactly i / rate (no drift)."""
    if rate <= 0 or duration_s < 0:
        raise LoadError(f"a steady schedule needs rate > 0 and duration >= 0 (got {rate}, {duration_s})")
    n = round(rate * duration_s)
    return (i / rate for i in range(n))


def phased(phases: Sequence[tuple[float, float]]) -> Iterator[float]:
    """Consecutive ``(rate, duration_s)`` phases (a burst: low, high, low). A rate of 0 is a pause."""
    start = 0.0
    for rate, duration in phases:
        if rate > 0:
            for t in steady(rate, duration):
                yield start + t
        start += duration


def from_trace(arrivals: Iterable[float], speedup: float = 1.0) -> Iterator[float]:
    """A trace's arrival times (seconds, any origin), replayed ``speedup`` times faster from its first one."""
    if speedup <= 0:
        raise LoadError("speed-up must be > 0")
    first: float | None = None
    last = 0.0
    for t in arrivals:
        first = t if first is None else first
        offset = (t - first) / speedup
        if offset < last:
            raise LoadError("trace arrivals must be sorted by time")
        last = offset
        yield offset


class TraceJob(msgspec.Struct, frozen=True, kw_only=True):
    """One line of a load trace (JSON lines, or CSV with these column names)."""

    t: float
    profile: str = "1g.5gb"
    duration_s: float | None = None
    tenant: str = "load"
    priority: int = 0


def read_trace(path: Path) -> list[TraceJob]:
    """A JSON-lines (``{"t": 0.5, "profile": "2g.10gb", "duration_s": 3}``) or CSV (same names) trace."""
    try:
        if path.suffix == ".csv":
            with path.open(newline="", encoding="utf-8") as fh:
                rows: list[dict[str, Any]] = [{k: v for k, v in r.items() if v not in ("", None)}
                                              for r in csv.DictReader(fh)]
            return [msgspec.convert(r, TraceJob, strict=False) for r in rows]
        with path.open(encoding="utf-8") as fh:
            return [msgspec.json.decode(line, type=TraceJob) for line in fh if line.strip()]
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        raise LoadError(f"cannot read trace {path}: {exc}") from exc


@dataclass
class JobFactory:
    """Builds the i-th JobSubmit of a run: profiles drawn from ``profile_mix`` (weights), a fixed seed."""

    run_id: str
    profile_mix: Mapping[str, float] = field(default_factory=lambda: {"1g.5gb": 1.0})
    duration_hint_s: float | None = 5.0
    tenant: str = "load"
    seed: int = 7

    def __post_init__(self) -> None:
        if not self.profile_mix or min(self.profile_mix.values()) < 0 or sum(self.profile_mix.values()) <= 0:
            raise LoadError("profile mix needs positive weights")
        self._rng = random.Random(self.seed)
        self._profiles = list(self.profile_mix)
        self._weights = [self.profile_mix[p] for p in self._profiles]
        self._demands = {p: Demand(kind="mig", profile=p) for p in self._profiles}

    def job_id(self, i: int) -> str:
        return f"{self.run_id}-{i}"

    def make(self, i: int, trace: TraceJob | None = None, submitted_at: float | None = None) -> JobSubmit:
        if trace is not None:
            profile, hint, tenant, prio = trace.profile, trace.duration_s, trace.tenant, trace.priority
        else:
            profile = self._rng.choices(self._profiles, self._weights)[0]
            hint, tenant, prio = self.duration_hint_s, self.tenant, 0
        demand = self._demands.get(profile) or Demand(kind="mig", profile=profile)
        return JobSubmit(id=f"m-{self.run_id}-{i}", job_id=self.job_id(i), tenant=tenant, priority=prio,
                         demand=demand, duration_hint_s=hint,
                         submitted_at=time.time() if submitted_at is None else submitted_at)


_STATUS = {"503": "no stream captures the subject (no responders)"}


class Publisher(Protocol):
    """What the generator needs from a NATS client (``nats.aio.client.Client`` fits)."""

    def new_inbox(self) -> str: ...
    async def subscribe(self, subject: str, cb: Callable[[Any], Awaitable[None]], **kw: Any) -> Any: ...
    async def publish(self, subject: str, payload: bytes = b"", reply: str = "",
                      headers: dict[str, str] | None = None) -> None: ...
    async def flush(self, timeout: int = 10) -> None: ...


def new_histogram() -> HdrHistogram:
    """Microseconds from 1 µs to 1 h at 3 significant digits (the recorder's unit too)."""
    return HdrHistogram(1, 3_600_000_000, 3)


@dataclass
class GeneratorStats:
    sent: int = 0
    acked: int = 0
    duplicates: int = 0
    """Acks flagged duplicate by the stream (a Nats-Msg-Id seen in the dedupe window)."""
    ack_errors: Counter[str] = field(default_factory=Counter)
    send_lag_us: HdrHistogram = field(default_factory=new_histogram)
    ack_latency_us: HdrHistogram = field(default_factory=new_histogram)
    """Intended send instant -> stream acknowledgement: what a publisher waits for to know a job is safe."""
    elapsed_s: float = 0.0

    @property
    def unacked(self) -> int:
        return self.sent - self.acked - sum(self.ack_errors.values())


async def paced(schedule: Iterable[float], start: int, clock: Callable[[], int],
                sleep: Callable[[float], Awaitable[Any]], yield_every: int = 64) -> AsyncIterator[tuple[int, int, int]]:
    """``(index, due, now)`` for each offset of ``schedule`` (seconds after ``start``, on ``clock``'s
    nanoseconds): waits while ahead of the schedule, never while behind, and never shifts a later instant."""
    for i, offset in enumerate(schedule):
        due = start + int(offset * 1e9)
        now = clock()
        if due > now:
            await sleep((due - now) / 1e9)  # ahead of schedule: the only place we ever wait
            now = clock()
        elif i % yield_every == 0:
            await asyncio.sleep(0)  # behind: keep sending, but let acks and the flusher run
        yield i, due, now


class Generator:
    """Publishes a schedule of JobSubmits to ``jobs.submit`` (of ``subjects``' namespace) as a JetStream
    publisher would (``Nats-Msg-Id``, reply inbox for the PubAck), without ever waiting for the system."""

    def __init__(self, nc: Publisher, subjects: Subjects, jobs: JobFactory, schedule: Schedule, *,
                 trace: Sequence[TraceJob] | None = None,
                 on_submit: Callable[[str, int], None] | None = None,
                 clock: Callable[[], int] = time.monotonic_ns,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 yield_every: int = 64) -> None:
        self.nc, self.subjects, self.jobs, self.schedule, self.trace = nc, subjects, jobs, schedule, trace
        self.on_submit = on_submit
        self.clock, self.sleep, self.yield_every = clock, sleep, yield_every
        self.stats = GeneratorStats()
        self._intended: dict[int, int] = {}
        self._inbox = ""
        self._done = asyncio.Event()
        self._sending_done = False

    async def _on_ack(self, msg: Any) -> None:
        now = self.clock()
        i = int(msg.subject.rsplit(".", 1)[1])
        intended = self._intended.pop(i, None)
        if intended is None:  # a second reply to one publish: count nothing twice
            return
        headers = getattr(msg, "headers", None)
        status = headers.get("Status") if headers else None
        data = msg.data
        if status is None and data.startswith(b'{"stream"') and b'"error"' not in data:
            # the common case, without a JSON parse: thousands of these a second share the generator's core
            self.stats.acked += 1
            # nats-server writes `"duplicate": true` (with a space); accept the compact form too
            self.stats.duplicates += b'"duplicate": true' in data or b'"duplicate":true' in data
            self.stats.ack_latency_us.record_value(max(1, (now - intended) // 1000))
        else:
            self.stats.ack_errors[self._ack_error(status, data)] += 1
        if not self._intended and self._sending_done:
            self._done.set()

    @staticmethod
    def _ack_error(status: str | None, data: bytes) -> str:
        if status is not None:
            return _STATUS.get(status, f"status {status}")
        try:
            err = json.loads(data)["error"]
        except (ValueError, KeyError, TypeError):
            return "undecodable ack"
        return str(err.get("description", err)) if isinstance(err, dict) else str(err)

    async def run(self) -> GeneratorStats:
        self._inbox = self.nc.new_inbox()  # under the caller's inbox prefix, so locked-down servers allow it
        await self.nc.subscribe(f"{self._inbox}.*", cb=self._on_ack, pending_msgs_limit=10_000_000,
                                pending_bytes_limit=-1)
        self._sending_done = False
        subject = self.subjects.jobs_submit
        start = self.clock()
        wall0 = time.time()  # submitted_at carries the intended instant too (the stack's own latency figures)
        async for i, due, now in paced(self.schedule, start, self.clock, self.sleep, self.yield_every):
            msg = self.jobs.make(i, self.trace[i] if self.trace is not None else None,
                                 submitted_at=wall0 + (due - start) / 1e9)
            self._intended[i] = due
            if self.on_submit is not None:
                self.on_submit(msg.job_id, due)
            await self.nc.publish(subject, encode(msg), reply=f"{self._inbox}.{i}",
                                  headers={"Nats-Msg-Id": msg.id})
            self.stats.sent += 1
            self.stats.send_lag_us.record_value(max(1, (now - due) // 1000))
        self._sending_done = True
        await self.nc.flush()
        self.stats.elapsed_s = (self.clock() - start) / 1e9
        return self.stats

    async def wait_acks(self, timeout_s: float) -> int:
        """Wait (bounded) for outstanding acknowledgements; returns how many never came."""
        if self._intended:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._done.wait(), timeout_s)
        return len(self._intended)
