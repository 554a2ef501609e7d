"""Per-job stage timestamps from the wire: submit → placed → command → running (→ exit), as HDR histograms.

The recorder only listens (core subscriptions, the ``audit`` role's rights): ``sched.placed``, ``cmd.*`` (the
first ``place`` command of a job), ``node.*.report`` (the ``place`` command's ``cmd_done``; an older executor's
``job_started``), ``jobs.exit`` and ``dlq.>``. It never
joins a JetStream consumer, so it cannot disturb the stack's deliveries. A job's clock starts at the
generator's *intended* send instant (``submitted``), never at the actual one, so a stall anywhere shows up as
latency (see ``load.generator``). The first sighting of a stage counts; later ones are duplicates
(at-least-once redelivery). Messages are probed for ``job_id`` and ``kind`` only (the names of
``shared.events``), which keeps the recorder cheap enough to watch thousands of messages a second.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from hdrh.histogram import HdrHistogram

from load.generator import new_histogram
from shared.events import Subjects

STAGES = ("placed", "command", "running", "exit")
"""Stages after submit, in pipeline order."""
SPANS = {  # histogram name -> (from stage, to stage); "submit" is the intended send instant
    "submit→placed": ("submit", "placed"), "submit→command": ("submit", "command"),
    "submit→running": ("submit", "running"), "placed→command": ("placed", "command"),
    "command→running": ("command", "running"),
}
ORDER = ("submit", *STAGES)


class _Probe(msgspec.Struct):
    job_id: str | None = None
    kind: str | None = None
    exit: str | None = None
    command: str | None = None


_probe = msgspec.json.Decoder(_Probe)


class LatencySummary(msgspec.Struct, frozen=True):
    """Milliseconds (HDR: 3 significant digits). No mean: hdrh computes it by walking every bucket in Python
    (~0.4 s a histogram), and a mean hides exactly the tail the budgets are about."""

    count: int
    p50: float
    p90: float
    p99: float
    p999: float
    max: float


def summarize(h: HdrHistogram) -> LatencySummary:
    """Percentiles of a microsecond histogram, in milliseconds."""
    if h.get_total_count() == 0:
        return LatencySummary(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    pct = h.get_percentile_to_value_dict([50, 90, 99, 99.9])  # one pass for all four

    def ms(us: float) -> float:
        return round(us / 1000.0, 3)

    return LatencySummary(count=h.get_total_count(), p50=ms(pct[50]), p90=ms(pct[90]), p99=ms(pct[99]),
                          p999=ms(pct[99.9]), max=ms(h.get_max_value()))


@dataclass
class Recorder:
    """Accounts every job of one run (job ids starting with ``run_id``); ``final`` is the last stage awaited.
    Once a job has been seen at every stage up to ``final`` its timeline is dropped (memory stays flat over a
    soak) unless ``keep_jobs``."""

    run_id: str
    subjects: Subjects = field(default_factory=lambda: Subjects(""))
    final: str = "exit"
    keep_jobs: bool = False
    skip: frozenset[str] = frozenset()
    """Intermediate stages not watched at all (``placed``, ``command``, ``running``): each watched stage costs
    the harness a message parse per job and the server a copy per job, CPU the stack under test then lacks
    on a shared machine. Their spans are not measured; the final stage and the submit → command budget
    are."""
    ordered: bool = False
    clock: Callable[[], int] = time.monotonic_ns
    submitted_n: int = 0
    reached: Counter[str] = field(default_factory=Counter)
    duplicates: Counter[str] = field(default_factory=Counter)
    reordered: int = 0
    """Hops whose later stage was seen before the earlier one (different subjects race on the wire)."""
    foreign: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    exit_kinds: Counter[str] = field(default_factory=Counter)
    per_second: dict[str, Counter[int]] = field(default_factory=dict)
    hist: dict[str, HdrHistogram] = field(default_factory=dict)
    first: dict[str, int] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)
    timelines: dict[str, dict[str, int]] = field(default_factory=dict)
    done: dict[str, dict[str, int]] = field(default_factory=dict)
    """Finished timelines, kept only with ``keep_jobs`` (tests, debugging)."""

    def __post_init__(self) -> None:
        if self.final not in STAGES:
            raise ValueError(f"final stage must be one of {STAGES}")
        if self.final in self.skip or not self.skip <= set(STAGES):
            raise ValueError(f"skip must name stages of {STAGES} other than the final one ({self.final})")
        self.watched = tuple(st for st in STAGES[: STAGES.index(self.final) + 1] if st not in self.skip)
        """The stages this recorder waits for, in pipeline order."""
        self.hist = {name: new_histogram() for name in SPANS}
        self.per_second = {s: Counter() for s in ORDER}
        self._origin = self.clock()
        self._prefix = f"{self.run_id}-"
        self._needed = len(self.watched) + 1  # submit + the watched stages
        self._complete = asyncio.Event()
        self._subs: list[Any] = []

    # --- accounting (pure: the clock is injected) ----------------------------------------------------------
    def submitted(self, job_id: str, intended_ns: int) -> None:
        self.timelines[job_id] = {"submit": intended_ns}
        self.submitted_n += 1
        self.per_second["submit"][(intended_ns - self._origin) // 1_000_000_000] += 1
        self.first.setdefault("submit", intended_ns)
        self.last["submit"] = intended_ns
        self._complete.clear()

    def observe(self, stage: str, job_id: str, t_ns: int | None = None) -> None:
        t = self.clock() if t_ns is None else t_ns
        if not job_id.startswith(self._prefix):
            self.foreign += 1
            return
        if stage not in self.watched:  # after the final stage, or skipped: not awaited in this run
            return
        tl = self.timelines.get(job_id)
        if tl is None:
            if job_id in self.done or self._finished_earlier(job_id):
                self.duplicates[stage] += 1
            else:  # seen before its submit was recorded: impossible unless ids collide across runs
                self.errors["stage before submit"] += 1
            return
        if stage in tl:
            self.duplicates[stage] += 1
            return
        tl[stage] = t
        self.reached[stage] += 1
        self.per_second[stage][(t - self._origin) // 1_000_000_000] += 1
        self.first.setdefault(stage, t)
        self.last[stage] = t
        for name, (a, b) in SPANS.items():
            if stage in (a, b) and a in tl and b in tl:
                d = tl[b] - tl[a]
                if d < 0:
                    self.reordered += 1
                self.hist[name].record_value(max(1, d // 1000))
        # Done when every stage up to ``final`` has been seen, not merely ``final``: stages come from
        # different publishers (and subscriptions), so a job's exit can overtake its start report by a hair.
        if len(tl) == self._needed:
            del self.timelines[job_id]
            if self.keep_jobs:
                self.done[job_id] = tl
            if not self.timelines:
                self._complete.set()

    def _finished_earlier(self, job_id: str) -> bool:
        # without keep_jobs a finished job's timeline is gone; a job id of this run that is not pending and
        # whose index is below the number submitted has finished, so a late sighting is a duplicate
        try:
            return int(job_id[len(self._prefix):]) < self.submitted_n
        except ValueError:
            return False

    def lost(self) -> dict[str, int]:
        """Jobs submitted that never reached each watched stage (so far)."""
        return {s: self.submitted_n - self.reached[s] for s in self.watched}

    def on_message(self, subject: str, data: bytes, headers: dict[str, str] | None = None) -> None:
        """Route one wire message to its stage."""
        try:
            kind, _node = self.subjects.kind_of(subject)
        except ValueError:
            if ".dlq." in f".{subject}":
                reason = (headers or {}).get("Migsched-Error", "no reason header")
                self.errors[f"dead-lettered: {reason[:80]}"] += 1
            return
        if kind not in ("placed", "cmd", "report", "exit"):
            return
        try:
            p = _probe.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.errors[f"undecodable {kind}"] += 1
            return
        if p.job_id is None:
            return
        if kind == "placed":
            self.observe("placed", p.job_id)
        elif kind == "cmd" and p.kind in (None, "place"):
            self.observe("command", p.job_id)
        elif kind == "report" and p.kind == "cmd_done" and p.command == "place":
            self.observe("running", p.job_id)  # a place's cmd_done is its start report
        elif kind == "report" and p.kind == "job_started":  # an older executor also sent this after cmd_done
            if p.job_id not in self.timelines or "running" not in self.timelines[p.job_id]:
                self.observe("running", p.job_id)
        elif kind == "exit":
            self.exit_kinds[p.kind or "?"] += 1
            self.observe("exit", p.job_id)

    # --- wire -----------------------------------------------------------------------------------------------
    async def attach(self, nc: Any) -> None:
        """Subscribe on ``nc`` (core NATS; the audit role may). Call before the generator starts."""
        s = self.subjects

        async def cb(msg: Any) -> None:
            self.on_message(msg.subject, msg.data, msg.headers)

        # nats-py runs each subscription's callbacks in its own task, so with one subscription per subject a
        # job's command can be handled before its placement: end-to-end figures stay right, a hop may be
        # counted as reordered. ``ordered`` takes the namespace's whole traffic through one subscription
        # instead (exact order, but every submit and heartbeat is parsed too: for tests, not for full load).
        if self.ordered and not s.namespace:
            raise ValueError("an ordered recorder needs a namespace")
        # Stages after ``final`` are not subscribed at all: every message costs the harness ~50 µs of CPU
        # that the stack under test does not get (``--final command`` for the submit → command budget).
        by_stage = {"placed": s.sched_placed, "command": s.cmd("*"), "running": s.node_reports,
                    "exit": s.jobs_exit}
        wanted = [f"{s.namespace}.>"] if self.ordered else [*(by_stage[st] for st in self.watched), s.dlq(">")]
        for subject in wanted:  # the recorder must never be the one that drops messages
            self._subs.append(await nc.subscribe(subject, cb=cb, pending_msgs_limit=10_000_000,
                                                 pending_bytes_limit=-1))
        await nc.flush()

    async def detach(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()

    async def wait_complete(self, timeout_s: float) -> bool:
        """Wait (bounded) until every submitted job reached ``final``; False if some never did."""
        if not self.timelines:
            return True
        try:
            await asyncio.wait_for(self._complete.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def throughput(self) -> dict[str, tuple[float, int]]:
        """Per stage: (mean rate between its first and last event, busiest whole second)."""
        out: dict[str, tuple[float, int]] = {}
        for stage, c in self.per_second.items():
            n = sum(c.values())
            if n:
                span_s = (self.last[stage] - self.first[stage]) / 1e9
                mean = (n - 1) / span_s if n > 1 and span_s > 0 else float(n)
                out[stage] = (round(mean, 1), max(c.values()))
        return out

    def latencies(self) -> dict[str, LatencySummary]:
        return {name: summarize(h) for name, h in self.hist.items()}
