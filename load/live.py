"""Run one load scenario against the real stack as processes, on private servers, and profile the services.

    .venv/bin/python -m load.live steady-1000-2x8 --duration 20 --report out/load.md --profile .run/prof

Starts a private nats-server (JetStream on disk) and redis-server (AOF) on free ports, the stack
(``migsched.stack``: balancer, registry, migration-planner and the scenario's simulated executors) in a
fresh namespace with ``MIGSCHED_PROFILE`` set, runs ``python -m load scenario <name>`` against it (sampling
every service's RSS), stops the stack with SIGTERM (the services then write their CPU profiles) and prints
the top functions of each profile by own CPU time. It also prints each stack process's CPU seconds (from
``/proc``, no profiler needed) spent while the scenario ran, the figure to compare runs by on a shared machine.

The private nats-server runs with ``GOMAXPROCS`` = ``--nats-procs`` (default 1): on a small machine shared with
a dozen busy processes, Go's idle processors spin looking for work, and one processor costs the server less CPU
for the same messages.

A scenario of ``n`` nodes × 8 GPUs runs as ``ceil(n * 8 / 64)`` simulated executor nodes of up to 64 GPUs each
(a registration carries at most 64 GPUs): the same GPUs and slices, fewer nodes. Those nodes run in
``--executor-procs`` processes (default 1, ``MIGSCHED_NODES``): each node keeps its own consumer, heartbeats and
GPUs, as on its own host, and the nodes of one process share one NATS connection, so that a small machine spends
its cores on the services rather than on executor event loops. In a cluster the executors run on the GPU nodes,
not beside the scheduler.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import redis as redis_sync

from load.cpu_watch import CpuWatch, cpu_seconds
from load.scenarios import scenario
from migsched.stack import Stack, StackConfig
from services.common import stalls
from shared.localcluster import start_nats_cluster, start_redis_sentinel
from shared.localservers import free_port, start_nats, start_redis

REPO = Path(__file__).resolve().parents[1]


RETENTION_S = 0.0
"""Ended jobs kept in Redis, and messages in the streams, in a load run (0: the services' defaults, a day).
A shorter retention keeps Redis small, so its AOF rewrites (a fork writing the whole dataset) are shorter, but
the expiry's deletions cost Redis CPU of their own: the default is the services' own."""


def service_env(retention_s: float, retention_max: int | None = None) -> dict[str, str]:
    """The services' environment in a load run (``retention_s`` 0: their default retentions;
    ``retention_max`` None: their default cap on ended jobs)."""
    env = {"MIGSCHED_LOG_LEVEL": "WARNING", "MIGSCHED_NODE_TIMEOUT_S": "60"}
    if retention_s > 0:  # the same for both: a job must outlive every message that could name it
        env |= {"MIGSCHED_STREAM_MAX_AGE_S": str(retention_s), "MIGSCHED_JOB_RETENTION_S": str(retention_s)}
    if retention_max is not None:
        env["MIGSCHED_JOB_RETENTION_MAX"] = str(retention_max)
    return env


def disk_mib(path: Path) -> float:
    """What the files under ``path`` hold (the private nats-server's JetStream store), in MiB."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def hot_spots(profile_dir: Path, top: int = 8) -> str:
    out: list[str] = []
    for f in sorted(profile_dir.glob("*.prof")):
        st = pstats.Stats(str(f))
        total = st.total_tt  # type: ignore[attr-defined]
        rows = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]  # type: ignore[attr-defined]
        out.append(f"{f.stem}: {total:.1f} s CPU")
        for (file, line, fn), (_cc, _nc, tt, ct, _callers) in rows:
            out.append(f"    {tt:7.2f} s own {ct:7.2f} s cum  {Path(file).name}:{line} {fn}")
    return "\n".join(out)


def pauses(run_dir: Path, top: int = 12) -> str:
    """The stalls the services logged (``services.common.stalls``): per service and kind, how many, the
    longest and their sum, then the longest ones with their monotonic instants (``mono``, the clock of
    ``--timelines``)."""
    found = [hit for log in sorted(run_dir.glob("*.log")) for line in log.read_text(errors="replace").splitlines()
             if (hit := stalls.parse(line)) is not None]
    if not found:
        return f"pauses: none of {stalls.STALL_LOG_S * 1e3:.0f} ms or more logged by the services"
    groups: dict[tuple[str, str], list[float]] = {}
    for service, kind, ms, _mono in found:
        groups.setdefault((service, kind), []).append(ms)
    out = [f"pauses of {stalls.STALL_LOG_S * 1e3:.0f} ms or more logged by the services:"]
    for (service, kind), each in sorted(groups.items()):
        out.append(f"    {service:22s} {kind:5s} {len(each):5d} x, max {max(each):7.1f} ms, "
                   f"sum {sum(each):8.1f} ms")
    out.append("    longest:")
    for service, kind, ms, mono in sorted(found, key=lambda h: -h[2])[:top]:
        out.append(f"      mono {mono:12.3f}  {service:22s} {kind:5s} {ms:7.1f} ms")
    return "\n".join(out)


def watch_redis(url: str) -> None:
    """Have Redis record its own pauses of 10 ms or more (fork, AOF writes, expiry cycles)."""
    r = redis_sync.Redis.from_url(url)
    r.config_set("latency-monitor-threshold", 10)
    r.config_set("slowlog-log-slower-than", 5000)  # µs: the commands that hold every other client 5 ms or more
    r.config_set("slowlog-max-len", 1024)


def redis_pauses(url: str) -> str:
    """Redis's own account of the run: its latency events and what its AOF and dataset grew to."""
    r = redis_sync.Redis.from_url(url, decode_responses=True)
    info = r.info("persistence") | r.info("memory")
    out = [f"redis: used_memory {info['used_memory_human']}, AOF {info.get('aof_current_size', 0) / 2**20:.0f} MiB, "
           f"AOF rewrites {info.get('aof_rewrites', 0)}, last fork {info.get('latest_fork_usec', 0) / 1e3:.1f} ms"]
    stats = r.info("stats")
    out.append(f"    redis round trips (read events) {stats.get('total_reads_processed', 0)}, "
               f"commands {stats.get('total_commands_processed', 0)}")
    calls = sorted(r.info("commandstats").items(), key=lambda kv: -int(kv[1]["usec"]))
    for name, c in calls[:6]:  # where Redis's own CPU went, by command
        out.append(f"    redis {name.removeprefix('cmdstat_'):12s} {c['calls']:9d} calls, {c['usec'] / 1e6:6.2f} s, "
                   f"{c['usec_per_call']:6.1f} µs each")
    for event, _at, latest_ms, max_ms in r.execute_command("LATENCY", "LATEST") or []:
        out.append(f"    redis latency event {event}: latest {latest_ms} ms, max {max_ms} ms")
    slow: dict[str, list[float]] = {}
    for entry in r.slowlog_get(1024):
        words = [w if isinstance(w, str) else str(w) for w in entry["command"].split()[:2]]
        slow.setdefault(" ".join(words)[:60], []).append(entry["duration"] / 1e3)
    for what, ms in sorted(slow.items(), key=lambda kv: -sum(kv[1]))[:8]:
        out.append(f"    redis slow command {what!r}: {len(ms)} x, max {max(ms):.1f} ms, sum {sum(ms):.1f} ms")
    return "\n".join(out)


Servers = tuple[str, str, dict[str, int], Callable[[], None], str]
"""NATS URL, Redis URL, each server's pid by name, how to stop them, and the URL of the Redis that holds the data."""


def single_servers(work: Path, nats_procs: int) -> Servers:
    nats = start_nats(free_port(), work / "nats", env={"GOMAXPROCS": str(nats_procs)} if nats_procs > 0 else None)
    redis = start_redis(free_port(), work / "redis", appendonly=True)
    pids = {name: s.proc.pid for name, s in (("nats-server", nats), ("redis-server", redis)) if s.proc}

    def stop() -> None:
        nats.stop()
        redis.stop()

    return nats.url, redis.url, pids, stop, redis.url


def ha_servers(work: Path) -> Servers:
    """A 3-server NATS cluster and a Sentinel-watched Redis primary with two replicas (``shared.localcluster``)."""
    cluster = start_nats_cluster(3, work / "nats")
    sentinel = start_redis_sentinel(work / "redis")
    pids = {f"nats-server-{i}": s.proc.pid for i, s in enumerate(cluster.servers) if s.proc}
    pids |= {f"redis-server-{i}": s.proc.pid for i, s in enumerate(sentinel.redis) if s.proc}
    pids |= {f"redis-sentinel-{i}": s.proc.pid for i, s in enumerate(sentinel.sentinels) if s.proc}
    primary = sentinel.redis[sentinel.primary()].url

    def stop() -> None:
        cluster.stop()
        sentinel.stop()

    return cluster.url, sentinel.url, pids, stop, primary


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    sc = scenario(args.name)
    work = Path(tempfile.mkdtemp(prefix="migsched-live-"))
    (work / "nats").mkdir()
    (work / "redis").mkdir()
    servers_up = ha_servers(work) if args.ha else single_servers(work, args.nats_procs)
    nats_url, redis_url, server_pids, stop_servers, data_redis = servers_up
    watch_redis(data_redis)
    prof = Path(args.profile).resolve() if args.profile else None
    config = _stack_config(args, sc.gpus, sc.model, work, prof)
    os.environ["MIGSCHED_NATS_URL"] = nats_url
    os.environ["MIGSCHED_REDIS_URL"] = redis_url
    stack = Stack(config)
    rc = 1
    try:
        stack.start()
        asyncio.run(stack.wait_ready(120))
        cmd = _harness_cmd(args, sc.name, stack, nats_url, argv)
        print("+", " ".join(cmd), flush=True)
        procs_by_name = {p.name: p.popen.pid for p in stack.procs if p.popen is not None}
        rc = _run_harness(cmd, procs_by_name, server_pids, args.cpu_window)
        print(redis_pauses(data_redis), flush=True)
        print(f"nats-server JetStream store on disk: {disk_mib(work / 'nats'):.0f} MiB", flush=True)
    finally:
        status = stack.stop(grace_s=20)
        stop_servers()
        print("exit status:", status, flush=True)
        print(pauses(work / "run"), flush=True)
        # the servers' stores and the logs: ~100 MB a run, left behind by every run before
        shutil.rmtree(work, ignore_errors=True)
    if prof is not None:
        print(hot_spots(prof), flush=True)
    return rc


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m load.live", description=__doc__.splitlines()[0])
    ap.add_argument("name", help="a scenario of `python -m load scenarios`")
    ap.add_argument("--duration", type=float, help="seconds of arrivals (phases scaled in proportion)")
    ap.add_argument("--report", help="Markdown report to update")
    ap.add_argument("--profile", help="directory for the services' CPU profiles")
    ap.add_argument("--drain", type=float, default=30.0)
    ap.add_argument("--executor-procs", type=int, default=1,
                    help="processes the simulated executor nodes run in (0: one per node)")
    ap.add_argument("--nats-procs", type=int, default=1,
                    help="GOMAXPROCS of the private nats-server (0: the Go default, one per core)")
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--ha", action="store_true",
                    help="a 3-server NATS cluster (R3 streams) and Redis behind Sentinel (WAIT 1) instead of one of "
                         "each, and two replicas of each service")
    ap.add_argument("--skip", help="stages the recorder does not watch (see python -m load scenario --help)")
    ap.add_argument("--timelines", help="per-job stage instants as JSON (see python -m load scenario --help)")
    ap.add_argument("--final", help="the stage every job must reach (see python -m load scenario --help)")
    ap.add_argument("--cpu-window", type=float, default=20.0,
                    help="seconds per window of the CPU-per-process table printed after the run (0: none)")
    ap.add_argument("--retention", type=float, default=RETENTION_S,
                    help="seconds ended jobs stay in Redis and messages in the streams (0: the services' defaults)")
    ap.add_argument("--retention-max", type=int,
                    help="most ended jobs kept in Redis per shard (MIGSCHED_JOB_RETENTION_MAX; default: the services')")
    return ap


def _stack_config(args: argparse.Namespace, gpus: int, model: str, work: Path, prof: Path | None) -> StackConfig:
    """The stack of a run: the scenario's GPUs as simulated nodes of up to 64 GPUs, in a fresh namespace; with
    ``--ha`` R3 streams, a replica holding every transition acted on, and two of each service."""
    procs = max(1, math.ceil(gpus / 64))
    env = service_env(args.retention, args.retention_max)
    if prof is not None:
        prof.mkdir(parents=True, exist_ok=True)
        for old in prof.glob("*.prof"):
            old.unlink()
        env["MIGSCHED_PROFILE"] = str(prof)
    if args.ha:
        env |= {"MIGSCHED_STREAM_REPLICAS": "3", "MIGSCHED_REDIS_WAIT_REPLICAS": "1"}
    return StackConfig(
        replicas=2 if args.ha else 1,
        namespace="live" + uuid.uuid4().hex[:6],
        executors=procs,
        gpus=f"{model}:{gpus // procs}",
        run_dir=work / "run",
        reconfig_latency_s=0.0,
        heartbeat_s=2.0,
        stream_storage="file",
        nodes_per_executor=math.ceil(procs / args.executor_procs) if args.executor_procs > 0 else 1,
        metrics=False,
        env=env,
    )


def _harness_cmd(args: argparse.Namespace, name: str, stack: Stack, nats_url: str,
                 argv: list[str] | None) -> list[str]:
    """``python -m load scenario`` against the stack, sampling the RSS of its processes."""
    cfg = stack.config
    cmd = [
        sys.executable, "-m", "load", "scenario", name,
        "--nats", nats_url.split(",")[0],  # a client learns the cluster's other servers from the first
        "--namespace", cfg.namespace, "--rss", "--rss-interval", "2", "--drain", str(args.drain),
    ]
    for p in stack.procs:
        if p.popen is not None:
            cmd += ["--pid", f"{p.name}={p.popen.pid}"]
    if args.duration:
        cmd += ["--duration", str(args.duration)]
    if args.report:
        cmd += ["--report", args.report]
    skip = [st for st in (args.skip or "").split(",") if st]
    if "placed" not in skip:
        skip.append("placed")  # the balancer sends the command itself: no sched.placed to watch
    cmd += ["--skip", ",".join(skip)]
    if args.timelines:
        cmd += ["--timelines", str(Path(args.timelines).resolve())]
    if args.final:
        cmd += ["--final", args.final]
    servers_note = ("a 3-server NATS cluster (R3 streams) and a Redis primary with two replicas and three "
                    "sentinels (WAIT 1), two replicas of each service" if args.ha else
                    f"one nats-server (GOMAXPROCS {args.nats_procs or 'default'}) and one Redis")
    model, per = cfg.gpus.split(":")
    notes = [
        f"Stack as processes on private servers (JetStream file storage, Redis AOF): balancer, "
        f"registry, migration-planner, {cfg.executors} sim executor(s) × {per} {model} in "
        f"{len(stack.executor_groups())} process(es); {servers_note}. "
        f"Driver: `python -m load.live {' '.join(argv or sys.argv[1:])}`.",
        *args.note,
    ]
    for n in notes:
        cmd += ["--note", n]
    return cmd


def _run_harness(cmd: list[str], procs_by_name: dict[str, int], servers: dict[str, int], cpu_window: float) -> int:
    """Run the harness and print the CPU seconds each stack process and server spent meanwhile (the servers
    share the cores too: fewer messages or Redis calls per job show up there as well)."""
    cpu0 = {name: cpu_seconds(pid) for name, pid in {**procs_by_name, **servers}.items()}
    # the harness imports for a second or so before it sends: the watches started after it miss nothing
    harness = subprocess.Popen(cmd, cwd=str(REPO))
    watch = CpuWatch({**procs_by_name, **servers, "harness": harness.pid}, every_s=cpu_window)
    if cpu_window > 0:
        watch.start()
    try:
        rc = harness.wait()
    except BaseException:  # as subprocess.call: an interrupted run leaves no harness behind
        harness.kill()
        harness.wait()
        raise
    finally:
        watch.stop()
    print("CPU seconds while the scenario ran (stack processes):", flush=True)
    for name, pid in sorted(procs_by_name.items()):
        print(f"    {name:28s} {cpu_seconds(pid) - cpu0[name]:8.2f}", flush=True)
    print("CPU seconds while the scenario ran (servers):", flush=True)
    for name, pid in servers.items():
        print(f"    {name:28s} {cpu_seconds(pid) - cpu0[name]:8.2f}", flush=True)
    if watch.windows:
        print(f"CPU seconds per {cpu_window:g}-s window (and how busy all {watch.cores} cores were):", flush=True)
        print(watch.table("cpu"), flush=True)
        print(f"Seconds waiting, runnable, for a core per {cpu_window:g}-s window (all threads):", flush=True)
        print(watch.table("wait"), flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
