"""``migsched up``: the whole stack as local processes; ``up --demo`` also replays a workload and shows it.

migsched up                 # NATS/Redis found or started, balancer, registry, migration-planner and two
                            # simulated executors (8 x A100-40GB each); Ctrl-C stops everything cleanly
migsched up --demo          # ... then replays a short workload at a high speed-up, draws the slices filling
                            # and emptying, prints the KPIs next to the simulator's for the same input, exits
                            # 0
migsched up --ha            # on a 3-node NATS cluster (R3 streams) and a Redis primary with two replicas and
                            # three sentinels, all started here on loopback ports, two replicas of each service
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from migsched import demo as demo_replay
from migsched.stack import MODEL, Stack, StackConfig, StackError, gpus_per_node, replay_timers, stop_event
from services.executor.config import parse_gpu_specs


@click.command("up")
@click.option("--demo", is_flag=True, help="Replay a short workload, show the cluster, print KPIs, exit.")
@click.option(
    "--namespace",
    envvar="MIGSCHED_NAMESPACE",
    default=None,
    help="Namespace of streams/keys [default: '' for up, a fresh demo-<id> for --demo].",
)
@click.option("--executors", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--gpus", default=f"{MODEL}:8", show_default=True, help="GPUs per simulated executor.")
@click.option("--blocks", type=click.IntRange(0, 64), default=0, show_default=True,
              help="Spread the executors over this many topology blocks (block=b0, b1, ...), for gangs kept "
                   "within a block; 0: no labels.")
@click.option("--shards", type=click.IntRange(1, 64), default=None,
              help="Scheduling shards [default: as many as --blocks, else MIGSCHED_SHARDS, else 1].")
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the processes' logs go [default: ./.run/<namespace or 'default'>].",
)
@click.option(
    "--trace",
    default="synthetic",
    show_default=True,
    help="--demo workload: 'synthetic', an openb variant (default, gpushare40, ...) or a CSV path.",
)
@click.option("--jobs", "limit", type=int, default=200, show_default=True, help="--demo: jobs to replay.")
@click.option(
    "--speedup", type=float, default=2000.0, show_default=True, help="--demo: trace seconds per wall second."
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--json-out", type=click.Path(path_type=Path), default=None, help="--demo: write the KPIs here."
)
@click.option("--keep", is_flag=True, help="--demo: keep the namespace's streams and keys afterwards.")
@click.option("--ha", is_flag=True,
              help="Start a 3-node NATS cluster and a Sentinel-watched Redis here, and two replicas of each service.")
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=300.0,
    show_default=True,
    help="--demo: give up waiting for the last jobs after this many seconds.",
)
def command(
    demo: bool,
    namespace: str | None,
    executors: int,
    gpus: str,
    blocks: int,
    shards: int | None,
    run_dir: Path | None,
    trace: str,
    limit: int,
    speedup: float,
    seed: int,
    json_out: Path | None,
    keep: bool,
    ha: bool,
    timeout_s: float,
) -> None:
    """Start the stack locally (NATS/Redis already listening are used, otherwise started)."""
    if namespace is None:
        namespace = f"demo-{uuid.uuid4().hex[:6]}" if demo else ""
    run_dir = run_dir or Path.cwd() / ".run" / (namespace or "default")
    env: dict[str, str] = {}
    latency = 0.15
    if demo:
        # the whole stack runs on wall time: every policy timer shrinks with the replay's clock
        env = {**replay_timers(speedup), "MIGSCHED_LOG_LEVEL": "WARNING"}
        latency = 0.15 / speedup
    if blocks > executors:
        raise click.BadParameter(f"{blocks} blocks need at least as many executors (--executors {executors})",
                                 param_hint="--blocks")
    shards = shards or (blocks if blocks > 1 else None)
    if shards is not None:
        env["MIGSCHED_SHARDS"] = str(shards)
    rigs = HaRigs(run_dir / "ha") if ha else None
    if rigs is not None:
        env["MIGSCHED_STREAM_REPLICAS"] = "3"
    config = StackConfig(
        namespace=namespace,
        executors=executors,
        gpus=gpus,
        reconfig_latency_s=latency,
        confirm_s=1.0 / speedup if demo else 1.0,
        run_dir=run_dir,
        env=env,
        stream_storage="file" if ha or not demo else "memory",
        replicas=2 if ha else 1,
        blocks=blocks,
    )
    stack = Stack(config)
    console = Console(stderr=False)
    # the demo's workload is read before anything starts: a trace that is not there stops nothing half-started
    replay = demo_replay.workload(trace, limit, seed, gpus_per_node(gpus) * executors) if demo else None
    code = 0
    try:
        console.print(f"[bold]migsched up[/]: namespace {namespace or '(none)'}; logs in {run_dir}")
        if rigs is not None:
            rigs.start()
            console.print(f"HA servers started here: NATS {rigs.nats_url}; Redis {rigs.redis_url}")
        stack.start()
        console.print(
            f"NATS {stack.nats_url}{' (started here)' if stack.nats and stack.nats.owned else ''}; "
            f"Redis {stack.redis_url}{' (started here)' if stack.redis and stack.redis.owned else ''}"
        )
        if replay is not None:
            code = asyncio.run(demo_replay.run(stack, console, *replay, speedup, json_out, keep, timeout_s))
        else:
            asyncio.run(_serve(stack, console))
    except StackError as exc:
        console.print(f"[red]error:[/] {exc}")
        code = 1
    except KeyboardInterrupt:
        pass
    finally:
        status = stack.stop(servers=False)
        console.print("stopped: " + ", ".join(f"{k} {'ok' if v == 0 else v}" for k, v in status.items()))
        if demo and not keep and stack.nats is not None:
            with contextlib.suppress(Exception):  # a demo leaves nothing behind in shared servers
                asyncio.run(_forget(stack))
        stack.stop_servers()
        if rigs is not None:
            rigs.stop()
    sys.exit(code)


class HaRigs:
    """``up --ha``'s servers: a NATS cluster and a Redis with failover, which the stack is pointed at."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nats: Any = None
        self.redis: Any = None
        self._saved: dict[str, str | None] = {}

    @property
    def nats_url(self) -> str:
        return str(self.nats.url)

    @property
    def redis_url(self) -> str:
        return str(self.redis.url)

    def start(self) -> None:
        from shared.localcluster import start_nats_cluster, start_redis_sentinel

        (self.root / "redis").mkdir(parents=True, exist_ok=True)
        self.nats = start_nats_cluster(3, self.root / "nats")
        self.redis = start_redis_sentinel(self.root / "redis")
        for var, url in (("MIGSCHED_NATS_URL", self.nats_url), ("MIGSCHED_REDIS_URL", self.redis_url)):
            self._saved[var] = os.environ.get(var)
            os.environ[var] = url  # the stack resolves its servers from these

    def stop(self) -> None:
        for var, old in self._saved.items():
            if old is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = old
        for rig in (self.redis, self.nats):
            if rig is not None:
                rig.stop()


async def _serve(stack: Stack, console: Console) -> None:
    await stack.wait_ready()
    console.print(
        "[green]ready[/]: "
        + ", ".join(p.name for p in stack.procs)
        + f". Prometheus: {json.dumps(stack.metrics_ports)}"
    )
    console.print(next_steps(stack.config.namespace, stack.nats_url, stack.redis_url, stack.config.gpus)
                  + " Ctrl-C stops.")
    stop = stop_event()
    while not stop.is_set():
        for line in stack.revive():  # an executor killed to try node loss comes back and registers afresh
            console.print(f"[yellow]{line}[/]")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


def next_steps(namespace: str, nats_url: str, redis_url: str, gpus: str = f"{MODEL}:8") -> str:
    """How to use the stack just started: the commands with its namespace and servers, ready to paste, and a
    demand its GPUs (``--gpus``) can host: a MIG instance, a share of a time-sliced GPU, else a whole GPU."""
    where = []
    if namespace:
        where.append(f"--namespace {namespace}")
    if nats_url != "nats://127.0.0.1:4222":
        where.append(f"--nats-url {nats_url}")
    if redis_url != "redis://127.0.0.1:6379/0":
        where.append(f"--redis-url {redis_url}")
    flags = "".join(" " + w for w in where)
    env = f" (or `export MIGSCHED_NAMESPACE={namespace}`)" if namespace else ""
    specs = parse_gpu_specs(gpus)
    demand = ("--profile 3g" if any(g.mig for g in specs) else "--shared" if any(g.replicas for g in specs)
              else "--gpus 1")
    return (f"Submit with `migsched submit{flags} {demand} --duration 60`, watch with "
            f"`migsched status{flags}`{env}.")


async def _forget(stack: Stack) -> None:
    """Delete the namespace's streams and Redis keys."""
    from shared.bus import JetStreamBus
    from shared.state import RedisState

    st = stack.client_settings()
    state = RedisState.from_settings(st)
    try:
        await state.wipe()
    finally:
        await state.close()
    bus = await JetStreamBus.connect(st)
    try:
        await bus.delete_streams()
    finally:
        await bus.close()
