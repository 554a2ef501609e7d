"""``python -m load``: drive a stack that follows migsched's subjects and report what it did.

    python -m load scenarios                              # the load scenarios and the stack each expects
    python -m load scenario steady-1000-2x8 --report out/load.md
    python -m load run --rate 1000 --duration 30 --mix 1g.5gb=0.7,2g.10gb=0.3 --duration-hint 0.1
    python -m load trace arrivals.jsonl --speedup 50
    python -m load run --rate 500 --duration 5 --fake-stack --namespace try1   # the tools alone

Connections: ``--nats`` (default ``$MIGSCHED_NATS_URL`` or nats://127.0.0.1:4222) and ``--namespace`` (default
``$MIGSCHED_NAMESPACE``). On a locked-down server the generator logs in as ``--publisher-user`` and the
recorder as ``--audit-user``, with passwords from ``MIGSCHED_NATS_PASSWORD_<USER>`` (docs/operations.md, Security).

Stragglers: ``--stragglers FILE`` (default ``$MIGSCHED_LOAD_STRAGGLERS``, so ``python -m load.live``, whose
``python -m load scenario`` inherits the environment, takes it too) writes, when the recorder stops waiting
with jobs short of the final stage, each such job's recorded stage instants and what Redis
(``$MIGSCHED_REDIS_URL``, which ``load.live`` exports) holds about it while the stack still runs: its hash,
history, queue memberships and commands in flight, with a count per job state (``load/stragglers.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import shlex
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import nats

from load.fakestack import FakeStack
from load.generator import Generator, JobFactory, LoadError, from_trace, read_trace, steady
from load.memory import MemorySampler, find_services
from load.recorder import STAGES, Recorder
from load.report import collect, render, update, verdict
from load.scenarios import SCENARIOS, Budget, scenario
from load.stragglers import note as straggler_note
from load.stragglers import write as write_stragglers
from services.common import stalls
from shared import access
from shared.events import Subjects


def _mix(text: str) -> dict[str, float]:
    try:
        return {p: float(w) for p, w in (item.split("=") for item in text.split(",") if item)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"mix is profile=weight,... (got {text!r})") from None


def _pid(text: str) -> tuple[str, int]:
    name, _, pid = text.partition("=")
    if not pid.isdigit():
        raise argparse.ArgumentTypeError("--pid takes name=pid")
    return name, int(pid)


async def _connect(url: str, user: str | None) -> Any:
    if not user:
        return await nats.connect(url, name="migsched-load", pending_size=256 * 1024 * 1024)
    var = f"MIGSCHED_NATS_PASSWORD_{user.upper().replace('-', '_')}"
    password = os.environ.get(var)
    if password is None:
        raise LoadError(f"--*-user {user} needs its password in ${var}")
    return await nats.connect(url, name="migsched-load", pending_size=256 * 1024 * 1024,
                              **access.connect_options(user, password))


async def execute(args: argparse.Namespace, *, title: str, schedule: Any, factory: JobFactory, offered: float,
                  trace: Any = None, stack: str = "", budget: Budget | None = None,
                  pids: dict[str, int] | None = None, warmup_s: float = 0.0) -> int:
    subjects = Subjects(args.namespace)
    gen_nc = await _connect(args.nats, args.publisher_user)
    rec_nc = await _connect(args.nats, args.audit_user)
    fake_nc = await _connect(args.nats, None) if args.fake_stack else None
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rec = Recorder(factory.run_id, subjects, final=args.final, skip=frozenset(args.skip),
                   keep_jobs=bool(args.timelines))
    await rec.attach(rec_nc)
    fake = FakeStack(fake_nc, subjects) if fake_nc is not None else None
    if fake is not None:
        await fake.ensure_stream()
        await fake.start()
    stop = asyncio.Event()
    sampler = MemorySampler(pids, interval_s=args.rss_interval) if pids else None
    sampling = asyncio.create_task(sampler.run(stop)) if sampler else None
    gen = Generator(gen_nc, subjects, factory, schedule, trace=trace, on_submit=rec.submitted)
    # the harness's own pauses delay submissions past their intended instants, which count as latency
    pauses = stalls.GcPauses("load")
    pauses.install()
    watch = asyncio.create_task(stalls.watch_loop("load"))
    load0, cpu0 = os.getloadavg()[0], time.process_time()
    print(f"{title}: sending (run {factory.run_id}) ...", file=sys.stderr)
    stats = await gen.run()
    missing = await gen.wait_acks(args.drain)
    complete = await rec.wait_complete(args.drain)
    straggler_line = ""
    if not complete and args.stragglers:  # read Redis now, while the stack still holds them
        short = {j: dict(tl) for j, tl in list(rec.timelines.items())}
        try:
            straggling = await write_stragglers(args.stragglers, short, namespace=args.namespace,
                                                final=args.final, watched=rec.watched)
            straggler_line = straggler_note(straggling, args.stragglers)
        except Exception as exc:  # a diagnostic must not cost the run its report
            straggler_line = f"stragglers ({len(short)}): Redis not read ({exc!r}), nothing written"
            print(f"stragglers: could not read Redis: {exc!r}", file=sys.stderr)
    stop.set()
    watch.cancel()
    pauses.uninstall()
    if sampling is not None:
        await sampling
    summary = collect(title=title, command=args.command_line, started_at=started, offered_rate=offered,
                      duration_s=stats.elapsed_s, gen=stats, rec=rec, stack=stack,
                      memory=sampler.trends(warmup_s) if sampler else None)
    summary.cpus, summary.loadavg = os.cpu_count() or 0, (load0, os.getloadavg()[0])
    summary.harness_cpu_us_per_job = round(1e6 * (time.process_time() - cpu0) / max(1, stats.sent), 1)
    if not complete:
        summary.notes.append(f"stopped waiting after {args.drain:g} s with {len(rec.timelines)} jobs "
                             f"short of '{args.final}'")
        if straggler_line:
            summary.notes.append(straggler_line)
    if missing:
        summary.notes.append(f"{missing} publishes never acknowledged")
    if sampler and sampler.gone:
        summary.notes.append("processes gone during the run: " + ", ".join(sorted(sampler.gone)))
    if fake is not None:
        summary.notes.append("against the stand-in stack (load/fakestack.py), not the real services")
    summary.notes += args.note
    summary.checks = verdict(summary, budget or Budget())
    if fake is not None:
        await fake.stop()
        await fake.remove_stream()
    for nc in (gen_nc, rec_nc, fake_nc):
        if nc is not None:
            await nc.close()
    if args.timelines:
        Path(args.timelines).write_bytes(msgspec.json.encode(rec.done))
    text = render(summary)
    print(text)
    if args.report:
        update(Path(args.report), text)
    if args.json:
        Path(args.json).write_bytes(msgspec.json.format(msgspec.json.encode(summary)))
    return 0 if all(c.ok for c in summary.checks) else 1


def _stages(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in STAGES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown stage(s) {', '.join(bad)}; stages are {', '.join(STAGES)}")
    return names


def _run_id() -> str:
    return "L" + dt.datetime.now(dt.UTC).strftime("%H%M%S") + uuid.uuid4().hex[:4]


async def main_async(args: argparse.Namespace) -> int:
    if args.cmd == "scenarios":
        for s in SCENARIOS.values():
            print(f"{s.name:18} {s.summary}\n{'':18} stack: {s.stack()}")
        return 0
    if args.cmd == "fake-stack":
        nc = await _connect(args.nats, None)
        fake = FakeStack(nc, Subjects(args.namespace))
        await fake.ensure_stream()
        await fake.start()
        print("stand-in stack answering on", args.nats, f"namespace {args.namespace!r}; Ctrl-C to stop")
        try:
            await asyncio.Event().wait()
        finally:
            await fake.stop()
            await fake.remove_stream()
        return 0
    if args.cmd == "run":
        factory = JobFactory(_run_id(), args.mix, args.duration_hint)
        return await execute(args, title=args.title or f"steady {args.rate:g}/s for {args.duration:g} s",
                             schedule=steady(args.rate, args.duration), factory=factory, offered=args.rate)
    if args.cmd == "trace":
        jobs = read_trace(Path(args.file))
        if not jobs:
            raise LoadError("empty trace")
        span = (jobs[-1].t - jobs[0].t) / args.speedup
        factory = JobFactory(_run_id())
        return await execute(args, title=args.title or f"trace {Path(args.file).name} ×{args.speedup:g}",
                             schedule=from_trace((j.t for j in jobs), args.speedup), factory=factory,
                             offered=len(jobs) / span if span > 0 else float(len(jobs)), trace=jobs)
    sc = scenario(args.name)
    factory = JobFactory(_run_id(), sc.profile_mix, sc.duration_hint_s())
    pids = dict(args.pid) or (find_services() if sc.soak or args.rss else {})
    duration = args.duration or sc.duration_s
    return await execute(args, title=args.title or sc.name, schedule=sc.schedule(args.duration),
                         factory=factory, offered=sc.jobs / sc.duration_s, stack=sc.stack(), budget=sc.budget,
                         pids=pids, warmup_s=min(sc.warmup_s, duration / 5))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m load", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("scenarios", help="list the scenarios")
    fk = sub.add_parser("fake-stack", help="run the stand-in stack (placed, command, started, exit)")
    run = sub.add_parser("run", help="a steady rate")
    run.add_argument("--rate", type=float, required=True, help="arrivals per second")
    run.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals")
    run.add_argument("--mix", type=_mix, default={"1g.5gb": 1.0}, help="profile=weight,... (1g.5gb=1)")
    run.add_argument("--duration-hint", type=float, default=5.0, help="duration_hint_s of every job")
    tr = sub.add_parser("trace", help="replay a trace (JSON lines or CSV: t, profile, duration_s, ...)")
    tr.add_argument("file")
    tr.add_argument("--speedup", type=float, default=1.0)
    sc = sub.add_parser("scenario", help="one of `python -m load scenarios`")
    sc.add_argument("name")
    sc.add_argument("--duration", type=float, help="seconds (every phase scaled in proportion)")
    sc.add_argument("--rss", action="store_true", help="sample the services' RSS (always on for a soak)")
    sc.add_argument("--pid", type=_pid, action="append", default=[], help="name=pid of a process to sample")
    sc.add_argument("--rss-interval", type=float, default=5.0)
    for p in (fk, run, tr, sc):
        p.add_argument("--nats", default=os.environ.get("MIGSCHED_NATS_URL", "nats://127.0.0.1:4222"))
        p.add_argument("--namespace", default=os.environ.get("MIGSCHED_NAMESPACE", ""))
    for p in (run, tr, sc):
        p.add_argument("--publisher-user", help="NATS user of the generator (password from the environment)")
        p.add_argument("--audit-user", help="NATS user of the recorder")
        p.add_argument("--final", choices=STAGES, default="exit", help="the stage every job must reach")
        p.add_argument("--skip", type=_stages, default=(), help="intermediate stages not to watch, e.g. "
                       "placed,running (spares the harness's CPU; their spans are not measured)")
        p.add_argument("--drain", type=float, default=30.0, help="seconds to wait for stragglers")
        p.add_argument("--fake-stack", action="store_true", help="answer with the stand-in stack")
        p.add_argument("--report", help="Markdown report to update (e.g. out/load.md)")
        p.add_argument("--json", help="also write the run summary as JSON here")
        p.add_argument("--timelines", help="also write each finished job's stage instants (monotonic ns) as "
                       "JSON here: where in the run the slow jobs were (keeps them all in memory)")
        p.add_argument("--stragglers", default=os.environ.get("MIGSCHED_LOAD_STRAGGLERS") or None,
                       help="when jobs never reach the final stage, write what Redis holds about each of them "
                       "(hash, history, queues, commands) as JSON here (default $MIGSCHED_LOAD_STRAGGLERS)")
        p.add_argument("--title", help="report section heading (default: the scenario)")
        p.add_argument("--note", action="append", default=[], help="a line to add to the report section")
        p.set_defaults(rss_interval=5.0)
    ap.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.command_line = "python -m load " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        if not args.no_uvloop:
            try:
                import uvloop
            except ImportError:
                pass
            else:
                return int(uvloop.run(main_async(args)))
        return asyncio.run(main_async(args))
    except LoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
