"""Pipeline benchmark: submit -> balancer -> partitioner -> executor command, against the real NATS and Redis.

An open-loop generator publishes ``jobs.submit`` at a fixed rate; a fake executor (NATS only, like a real one)
registers ``--nodes`` x ``--gpus`` A100-40GB GPUs, confirms every command at once, and ends each job after its
duration hint, so that the cluster reaches a steady state. The submit -> command latency is measured from the
``submitted_at`` stamped at publish to the moment the command reaches the executor's consumer (same host, same
clock). Afterwards the state is audited (no double booking) and every job is accounted for.

    .venv/bin/python load/bench_pipeline.py --rate 1000 --seconds 20               # services in this process
    .venv/bin/python load/bench_pipeline.py --rate 1000 --seconds 20 --mode procs  # one process per service
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared.bus import Bus, Delivery, Outgoing  # noqa: E402
from shared.events import (  # noqa: E402
    CmdDone,
    Command,
    Demand,
    GpuReport,
    Heartbeat,
    JobExited,
    JobSubmit,
    Registered,
    new_id,
)
from shared.mig.geometry import default_geometry  # noqa: E402
from shared.settings import Settings, load  # noqa: E402
from shared.state import RedisState, audit  # noqa: E402

MIX = [("1g.5gb", 0.6), ("2g.10gb", 0.25), ("3g.20gb", 0.15)]


class FakeFleet:
    """Executors for ``nodes`` nodes in one consumer (``cmd.>``): confirms every command at once and ends each
    job ``duration_s`` later with an exit report, each on its own node's subjects, as real executors would."""

    def __init__(self, bus: Bus, nodes: list[str], gpus: int) -> None:
        self.bus, self.nodes, self.gpus = bus, nodes, gpus
        self.latencies: list[float] = []
        self.to_partitioner: list[float] = []  # submit -> the partitioner stamps the command
        self.first_at: float | None = None
        self.last_at = 0.0
        self.commands = 0
        self.seq = 0
        self.exits: list[tuple[float, JobExited]] = []
        self.consumer = bus.consumer(
            bus.subjects.stream_cmd, "bench-fleet", bus.subjects.cmd(">"), self.on_commands
        )

    async def start(self) -> None:
        await self.consumer.start()
        self.task = asyncio.create_task(self.consumer.run())
        self.exit_task = asyncio.create_task(self.exit_loop())
        await self.bus.publish_batch(
            [
                Outgoing(
                    self.bus.subjects.node_report(node),
                    Registered(
                        id=new_id("reg"),
                        node=node,
                        at=time.time(),
                        gpus=tuple(
                            GpuReport(index=i, uuid=f"GPU-{node}-{i}", model="A100-40GB")
                            for i in range(self.gpus)
                        ),
                    ),
                )
                for node in self.nodes
            ]
        )

    async def on_commands(self, ds: list[Delivery]) -> None:
        t = time.time()
        out: list[Outgoing] = []
        for d in ds:
            c: Command = d.data
            subj = self.bus.subjects.node_report(c.node)
            self.commands += 1
            if c.kind == "place":
                self.latencies.append(t - c.submitted_at)
                self.to_partitioner.append(c.at - c.submitted_at)
                self.first_at = self.first_at or t
                self.last_at = t
                self.exits.append(
                    (
                        t + (c.duration_s or 0.1),
                        JobExited(
                            id=f"exit-{c.cmd_id}".replace(":", "-"),
                            node=c.node,
                            at=0.0,
                            job_id=c.job_id or "",
                            gpu_index=c.gpu_index,
                            instance_id=c.instance_id,
                            exit="completed",
                        ),
                    )
                )
            out.append(
                Outgoing(
                    subj,
                    CmdDone(
                        id=f"{c.cmd_id}.done",
                        node=c.node,
                        at=t,
                        cmd_id=c.cmd_id,
                        command=c.kind,
                        job_id=c.job_id,
                    ),
                )
            )
        await self.bus.publish_batch(out)

    async def exit_loop(self) -> None:
        beat = 0.0
        while True:
            await asyncio.sleep(0.01)
            now = time.time()
            if now - beat >= 1.0:  # heartbeats, or the registry declares the nodes lost
                beat = now
                self.seq += 1
                await self.bus.publish_batch(
                    [
                        Outgoing(
                            self.bus.subjects.node_heartbeat(n),
                            Heartbeat(id=f"hb-{n}-{self.seq}", node=n, seq=self.seq, at=now),
                        )
                        for n in self.nodes
                    ]
                )
            due = [e for t, e in self.exits if t <= now]
            if due:
                self.exits = [(t, e) for t, e in self.exits if t > now]
                await self.bus.publish_batch(
                    [Outgoing(self.bus.subjects.node_report(e.node), e) for e in due]
                )

    async def stop(self) -> None:
        self.consumer.stop()
        self.exit_task.cancel()
        await self.task


def pick(rng: random.Random) -> str:
    x = rng.random()
    for prof, w in MIX:
        if x < w:
            return prof
        x -= w
    return MIX[-1][0]


async def generate(bus: Bus, rate: float, seconds: float, duration: float, rng: random.Random) -> int:
    """Open loop: every 10 ms publish what is due, never waiting on the system under test."""
    sent = 0
    t0 = time.time()
    tick = 0.01
    pending: list[asyncio.Future[Any]] = []
    while True:
        now = time.time()
        if now - t0 >= seconds:
            await asyncio.gather(*pending)
            return sent
        due = int((now - t0) * rate) - sent
        batch = []
        for _ in range(max(0, due)):
            job = f"j{sent}"
            batch.append(
                Outgoing(
                    bus.subjects.jobs_submit,
                    JobSubmit(
                        id=f"s-{job}",
                        job_id=job,
                        demand=Demand(kind="mig", profile=pick(rng)),
                        duration_hint_s=duration * rng.uniform(0.5, 1.5),
                        submitted_at=time.time(),
                    ),
                )
            )
            sent += 1
        if batch:
            # acknowledged in the background: an open loop never waits on the system under test
            pending.append(asyncio.ensure_future(bus.publish_batch(batch)))
            pending = [p for p in pending if not p.done()]
        await asyncio.sleep(max(0.0, tick - (time.time() - now)))


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


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    ns = args.namespace or "bench" + uuid.uuid4().hex[:6]
    settings = load(Settings, namespace=ns, stream_storage=args.storage, metrics_port=0)
    bus = await Bus.connect(settings, name="bench")
    await bus.ensure_streams()
    state = RedisState.from_settings(settings)
    procs: list[subprocess.Popen[bytes]] = []
    stack = None
    if args.mode == "inproc":
        from services.common.testing import Stack

        stack = Stack(ns, settings.nats_url, settings.redis_url, stream_storage=args.storage)
        await stack.start()
    else:
        env = {
            **os.environ,
            "MIGSCHED_NAMESPACE": ns,
            "MIGSCHED_STREAM_STORAGE": args.storage,
            "MIGSCHED_METRICS_PORT": "0",
            "MIGSCHED_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
        }
        for svc in ("balancer", "partitioner"):
            procs.append(subprocess.Popen([sys.executable, "-m", f"services.{svc}"], env=env, cwd=ROOT))
    execs = [FakeFleet(bus, [f"n{i}" for i in range(args.nodes)], args.gpus)]
    for e in execs:
        await e.start()
    deadline = time.time() + 20
    while len(await state.gpu_ids()) < args.nodes * args.gpus and time.time() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.5)  # the balancer's mirror picks the GPUs up from sched.capacity
    rng = random.Random(7)
    cpu0 = {p.pid: cpu_seconds(p.pid) for p in procs}
    cpu0[os.getpid()] = cpu_seconds(os.getpid())
    busy0 = machine_busy_seconds()
    t0 = time.time()
    sent = await generate(bus, args.rate, args.seconds, args.duration, rng)
    t_gen = time.time() - t0
    await asyncio.sleep(args.drain)
    wall = time.time() - t0
    busy = (machine_busy_seconds() - busy0) / wall
    # CPU seconds, unrounded: rounding the cores to 0.01 first (as this did) moved the per-job figure by 5 %
    cpu_s = {
        name: cpu_seconds(pid) - cpu0[pid]
        for name, pid in [
            ("balancer", procs[0].pid if procs else 0),
            ("partitioner", procs[1].pid if procs else 0),
            ("bench(load+executors)", os.getpid()),
        ]
        if pid in cpu0
    }
    cpu = {name: round(v / wall, 2) for name, v in cpu_s.items()}
    lat = [x for e in execs for x in e.latencies]
    part = [x for e in execs for x in e.to_partitioner]
    first = min(e.first_at or t0 for e in execs)
    last = max(e.last_at for e in execs)
    ids = [f"j{i}" for i in range(sent)]
    states: dict[str, int] = {}
    for k in range(0, len(ids), 1000):
        for j in await state.jobs(ids[k : k + 1000]):
            st = j.state if j else "missing"
            states[st] = states.get(st, 0) + 1
    violations = await audit(state, default_geometry())
    for e in execs:
        await e.stop()
    if stack is not None:
        await stack.stop()
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(timeout=10)
    if not args.keep:
        await bus.delete_streams()
        await state.wipe()
    await bus.close()
    await state.close()
    return {
        "mode": args.mode,
        "storage": args.storage,
        "gpus": args.nodes * args.gpus,
        "offered_rate": args.rate,
        "submitted": sent,
        "submit_rate": sent / t_gen,
        "commanded": len(lat),
        "command_rate": len(lat) / max(1e-9, last - first) if lat else 0.0,
        "p50_ms": pct(lat, 50) * 1000,
        "p90_ms": pct(lat, 90) * 1000,
        "p99_ms": pct(lat, 99) * 1000,
        "max_ms": max(lat) * 1000 if lat else float("nan"),
        "p50_to_partitioner_ms": pct(part, 50) * 1000,
        "p99_to_partitioner_ms": pct(part, 99) * 1000,
        "mean_ms": statistics.fmean(lat) * 1000 if lat else 0,
        "cpu_cores_used": cpu,
        "cpu_ms_per_command": {k: round(v / max(1, len(lat)) * 1000, 3) for k, v in cpu_s.items()},
        "cpu_s_per_1000_jobs_total": round(sum(cpu_s.values()) / max(1, len(lat)) * 1000, 3),
        "machine_busy_cores": round(busy, 2),
        "load_average_1m": os.getloadavg()[0],
        "job_states": states,
        "violations": [str(v) for v in violations[:10]],
        "n_violations": len(violations),
    }


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000.0, help="arrivals per second (open loop)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    ap.add_argument("--duration", type=float, default=1.0, help="mean job run time, s (uniform +-50%%)")
    ap.add_argument("--drain", type=float, default=3.0, help="seconds to wait after the last submit")
    ap.add_argument("--mode", choices=("inproc", "procs"), default="inproc")
    ap.add_argument("--storage", choices=("file", "memory"), default="file")
    ap.add_argument("--namespace", default="")
    ap.add_argument("--keep", action="store_true", help="keep the streams and keys afterwards")
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    r = asyncio.run(main(args))
    for k, v in r.items():
        print(f"{k:>14}: {v:.2f}" if isinstance(v, float) else f"{k:>14}: {v}")


if __name__ == "__main__":
    cli()
