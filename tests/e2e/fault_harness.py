"""Fault-test harness: private NATS (JetStream file storage) and Redis (AOF) servers, the stack as processes
in its own namespace, an open-loop load of short jobs, process kills/restarts, and the end-of-test accounting.

Every wait is a condition with a deadline; nothing asserts on wall-clock durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
from stack_fixture import environ

from migsched.stack import Proc, Stack, StackConfig
from shared.bus import JetStreamBus, Outgoing
from shared.events import Demand, JobExit, JobSubmit, now
from shared.localservers import LocalServer, free_port, start_nats, start_redis
from shared.mig.geometry import default_geometry
from shared.settings import Settings
from shared.state import TERMINAL_STATES, RedisState, Violation, audit

GEO = default_geometry()
PROFILES = ("1g.5gb", "1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb")

# Small timers so that a fault is noticed and repaired within a test: a crashed consumer's batch comes back
# after ack_wait, a silent node is lost after node_timeout, a command without a result fails after
# cmd_timeout.
FAULT_ENV = {
    "MIGSCHED_ACK_WAIT_S": "3",
    "MIGSCHED_NODE_TIMEOUT_S": "4",
    "MIGSCHED_CMD_TIMEOUT_S": "8",
    "MIGSCHED_MAX_ATTEMPTS": "20",
    "MIGSCHED_MIRROR_REFRESH_S": "2",
    "MIGSCHED_LOG_LEVEL": "WARNING",
    "MIGSCHED_COOLDOWN_S": "0.5",
    "MIGSCHED_DEFRAG_INTERVAL_S": "2",
    "MIGSCHED_RETENTION_WINDOW_S": "2",
}


@dataclass
class Servers:
    nats: LocalServer
    redis: LocalServer

    def stop(self) -> None:
        self.nats.stop()
        self.redis.stop()


def private_servers(workdir: Path) -> Servers:
    """A nats-server with JetStream on disk and a redis-server with AOF, on free ports, owned by the test."""
    (workdir / "nats").mkdir(parents=True, exist_ok=True)
    (workdir / "redis").mkdir(parents=True, exist_ok=True)
    nats = start_nats(free_port(), workdir / "nats")
    try:
        redis = start_redis(free_port(), workdir / "redis", appendonly=True)
    except Exception:
        nats.stop()
        raise
    return Servers(nats, redis)


def make_stack(servers: Servers, namespace: str, run_dir: Path, env: dict[str, str] | None = None,
               replicas: int = 1, nodes: int = 2, gpus: str = "A100-40GB:8", nodes_per_executor: int = 1) -> Stack:
    config = StackConfig(
        replicas=replicas,
        namespace=namespace,
        executors=nodes,
        nodes_per_executor=nodes_per_executor,
        gpus=gpus,
        run_dir=run_dir,
        reconfig_latency_s=0.01,
        heartbeat_s=0.5,
        confirm_s=0.2,
        stream_storage="file",
        metrics=False,
        env={**FAULT_ENV, **(env or {})},
    )
    stack = Stack(config)
    with environ({"MIGSCHED_NATS_URL": servers.nats.url, "MIGSCHED_REDIS_URL": servers.redis.url}):
        stack.start()
    return stack


@contextlib.contextmanager
def stack_on_redis(redis_url: str, tmp: Any, tag: str, **make: Any) -> Iterator[Stack]:
    """The stack as processes on a private NATS and the Redis at ``redis_url`` (a Sentinel or Cluster rig), ready;
    ``make``: ``make_stack``'s options."""
    nats = start_nats(free_port(), tmp.mktemp("nats"))
    st = make_stack(Servers(nats=nats, redis=LocalServer(url=redis_url)), tag[0] + uuid.uuid4().hex[:8],
                    tmp.mktemp(f"{tag}-run"), **make)
    try:
        asyncio.run(st.wait_ready(60))
        yield st
    finally:
        st.stop(servers=False)
        nats.stop()


def settings_of(stack: Stack) -> Settings:
    return stack.client_settings()


def proc(stack: Stack, name: str) -> Proc:
    for p in stack.procs:
        if p.name == name:
            return p
    raise KeyError(f"no process {name!r} in the stack ({[p.name for p in stack.procs]})")


def kill9(stack: Stack, name: str) -> None:
    """SIGKILL one service process: no graceful stop, no acks, no flush."""
    p = proc(stack, name)
    assert p.popen is not None and p.popen.poll() is None, f"{name} is not running"
    p.popen.send_signal(signal.SIGKILL)
    p.popen.wait(10)


def restart(stack: Stack, name: str) -> None:
    p = proc(stack, name)
    assert p.popen is None or p.popen.poll() is not None, f"{name} still runs"
    with p.log.open("a") as fh:
        fh.write(f"--- restarted by the fault test at {time.time():.3f}\n")
    stack._spawn(p)


def jobs_for(tag: str, n: int, seed: int = 7, duration: tuple[float, float] = (0.3, 1.5)) -> list[JobSubmit]:
    rng = random.Random(seed)
    return [
        JobSubmit(
            id=f"s-{tag}-{i}",
            job_id=f"{tag}-{i}",
            demand=Demand(kind="mig", profile=rng.choice(PROFILES)),
            duration_hint_s=round(rng.uniform(*duration), 3),
            submitted_at=0.0,
        )
        for i in range(n)
    ]


@dataclass
class Load:
    """Publishes jobs open-loop at ``rate`` per second (batches every 20 ms), stamping ``submitted_at``."""

    bus: JetStreamBus
    jobs: list[JobSubmit]
    rate: float
    published: int = 0
    errors: list[str] = field(default_factory=list)

    async def run(self) -> None:
        t0 = time.monotonic()
        while self.published < len(self.jobs):
            due = min(len(self.jobs), int((time.monotonic() - t0) * self.rate) + 1)
            batch = self.jobs[self.published : due]
            if batch:
                stamped = [msgspec.structs.replace(j, submitted_at=now()) for j in batch]
                try:
                    await self.bus.publish_batch(
                        [Outgoing(self.bus.subjects.jobs_submit, j) for j in stamped]
                    )
                    self.published = due
                except Exception as exc:  # NATS restarting: try the same batch again (same Nats-Msg-Id)
                    self.errors.append(repr(exc))
                    await asyncio.sleep(0.2)
                    continue
            await asyncio.sleep(0.02)

    async def until_published(self, share: float, timeout: float = 30.0) -> None:
        await wait_for(lambda: self.published >= share * len(self.jobs), timeout, "load progress")


async def wait_for(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if asyncio.iscoroutine(v):
            v = await v
        if v:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.2)


@dataclass
class Outcome:
    states: Counter[str]
    violations: list[Violation]
    exits: Counter[str]
    """job id -> completed exits on ``jobs.exit``."""
    busy: list[str]
    details: dict[str, list[str]] = field(default_factory=dict)
    """Diagnostics of the jobs with more than one exit: each exit and the job's state history."""


async def converge(stack: Stack, ids: list[str], timeout: float = 60.0, by_message_id: bool = False) -> Outcome:
    """Wait until every job is terminal (the processes stay up), then audit the quiescent state.
    ``by_message_id``: count a job's exits by message id, as every consumer does (on a NATS cluster a publish
    repeated to a stream's new leader can be stored twice under one id)."""
    st = settings_of(stack)
    state = RedisState.from_settings(st)
    try:

        async def all_terminal() -> bool:
            stack.check_alive()
            recs = await state.jobs(ids)
            return all(r is not None and r.state in TERMINAL_STATES for r in recs)

        try:
            await wait_for(all_terminal, timeout, "every job to end")
        except AssertionError:
            recs = await state.jobs(ids)
            stuck = Counter(r.state if r else "missing" for r in recs)
            raise AssertionError(f"jobs did not converge: {dict(stuck)}") from None

        async def quiet() -> bool:  # in-flight destroys and releases settle; the audit is exact when idle
            return not await audit(state, GEO) and not (await state.commands(0))

        with contextlib.suppress(AssertionError):
            await wait_for(quiet, 15, "a quiescent state")
        recs = await state.jobs(ids)
        states = Counter(r.state if r else "missing" for r in recs)
        violations = await audit(state, GEO)
        busy = [
            f"{g.id} {i.id} {i.state} {i.job}"
            for g in await state.load_gpus()
            for i in g.instances
            if i.state not in ("idle", "retiring")
        ]
    finally:
        await state.close()
    bus = await JetStreamBus.connect(st, name="fault-test")
    try:
        wanted = set(ids)
        all_exits = [e for e in await exits_on_stream(bus) if e.job_id in wanted]
        completed = [e for e in all_exits if e.kind == "completed"]
        if by_message_id:
            completed = list({e.id: e for e in completed}.values())
        exits = Counter(e.job_id for e in completed)
    finally:
        await bus.close()
    details: dict[str, list[str]] = {}
    twice = [j for j, n in exits.items() if n > 1]
    twice += sorted({b.split()[-1] for b in busy})  # the jobs still holding slices, for the same diagnosis
    twice += [r.job_id for r in recs if r is not None and r.state != "finished"][:5]
    if twice:
        state = RedisState.from_settings(st)
        try:
            for j in twice[:5]:
                details[j] = [repr(e) for e in all_exits if e.job_id == j]
                details[j] += [repr(h) for h in await state.history(j)]
        finally:
            await state.close()
    return Outcome(states, violations, exits, busy, details)


async def exits_on_stream(bus: JetStreamBus) -> list[JobExit]:
    for attempt in range(5):  # on a NATS cluster just after a server loss, a consumer's creation may time out
        try:
            sub = await bus.js.pull_subscribe(bus.subjects.jobs_exit, durable=None, stream=bus.subjects.stream_jobs)
            break
        except nats.errors.TimeoutError:
            if attempt == 4:
                raise
            await asyncio.sleep(1.0)
    out: list[JobExit] = []
    dec = msgspec.json.Decoder(JobExit)
    misses = 0
    try:
        while True:
            try:
                msgs = await sub.fetch(1000, timeout=1.0)
            except Exception:
                msgs = []
            for m in msgs:
                out.append(dec.decode(m.data))
                await m.ack()
            if msgs:
                continue
            # an empty fetch is the end only when the consumer has nothing left: just after a server loss, a
            # stream replica can be slow to hand over what it holds
            misses += 1
            try:
                left = (await sub.consumer_info()).num_pending
            except Exception:
                left = 1
            if not left or misses >= 10:
                break
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return out


def assert_accounted(out: Outcome, ids: list[str], *, all_finished: bool = True) -> None:
    """Every job exactly once: one terminal state each, at most one completed exit each (exactly one per
    finished job), no violation, nothing left holding slices."""
    diag = "\n".join(f"{j}:\n  " + "\n  ".join(lines) for j, lines in out.details.items())
    assert out.violations == [], "\n".join(str(v) for v in out.violations) + "\n" + diag
    assert out.busy == [], "\n".join(out.busy) + "\n" + diag
    assert sum(out.states.values()) == len(ids)
    assert set(out.states) <= set(TERMINAL_STATES), dict(out.states)
    if all_finished:
        assert out.states == Counter({"finished": len(ids)}), f"{dict(out.states)}\n{diag}"
    twice = {j: n for j, n in out.exits.items() if n > 1}
    assert not twice, f"jobs with more than one completed exit: {twice}\n" + "\n".join(
        f"{j}:\n  " + "\n  ".join(lines) for j, lines in out.details.items()
    )
    assert sum(out.exits.values()) == out.states["finished"], (sum(out.exits.values()), dict(out.states))


async def placement_pause(stack: Stack, ids: list[str]) -> float:
    """The longest stretch, while a load ran, with no job placed: how long decisions paused."""
    state = RedisState.from_settings(settings_of(stack))
    try:
        placed: list[float] = []
        for j in ids:
            placed += [h.at for h in await state.history(j) if h.to == "placing"]
    finally:
        await state.close()
    placed.sort()
    return max((b - a for a, b in itertools.pairwise(placed)), default=0.0)


async def through_fault(stack: Stack, tag: str, fault: Callable[[Load], Awaitable[None]], jobs: int = 240,
                        rate: float = 60.0, by_message_id: bool = False) -> tuple[Outcome, list[str], float]:
    """A steady load of ``jobs`` at ``rate``/s, ``fault(load)`` a third of the way in (it kills and restarts
    what it likes), then every job to its end: the outcome, the job ids, and the longest pause between two
    placements while the load ran."""
    bus = await JetStreamBus.connect(settings_of(stack), name=f"{tag}-load")
    load = Load(bus, jobs_for(tag, jobs), rate)
    try:
        task = asyncio.create_task(load.run())
        await load.until_published(0.3)
        await fault(load)
        await asyncio.wait_for(task, 120)
    finally:
        await bus.close()
    ids = [j.job_id for j in load.jobs]
    out = await converge(stack, ids, timeout=90, by_message_id=by_message_id)
    return out, ids, await placement_pause(stack, ids)
