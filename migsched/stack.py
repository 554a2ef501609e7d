"""The local stack as processes: what ``migsched up`` and the end-to-end tests start and stop.

NATS and Redis are resolved in this order (``MIGSCHED_*_URL``, else a server answering on the default
port, else a private ``nats-server``/``redis-server`` started here and stopped with the stack). Then one
process per service, each ``python -m services.<name>`` with its ``MIGSCHED_*`` environment and its output in
``<run_dir>/<name>.log``. ``stop()`` sends SIGTERM (services finish their batch and close), then SIGKILL
after a grace period. Readiness is read from the system itself: the balancer's durable consumer exists and
every executor's GPUs are registered in Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from shared.errors import MigschedError
from shared.localservers import LocalServer, free_port, resolve
from shared.settings import Settings, load

REPO = Path(__file__).resolve().parents[1]
RESTARTS = 5
"""Restarts of one process ``migsched up`` makes before it gives up on the stack (``Stack.revive``)."""
SCHEDULERS = ("balancer", "registry", "migration_planner")
MODEL = "A100-40GB"
"""The simulated executors' GPU model, unless ``--gpus`` names others."""


def replay_timers(speedup: float) -> dict[str, str]:
    """The policy timers of a stack that replays a trace ``speedup`` times faster than it was recorded: the
    simulator's defaults, in trace seconds, divided by the speed-up, so that the live stack and the simulator
    run the same policy on the same clock (the stack runs on wall time)."""
    from shared.settings import BalancerSettings

    return {
        "MIGSCHED_COOLDOWN_S": repr(120.0 / speedup),
        "MIGSCHED_MIN_LEFT_S": repr(30.0 / speedup),
        "MIGSCHED_DEFRAG_INTERVAL_S": repr(300.0 / speedup),
        "MIGSCHED_RETENTION_WINDOW_S": repr(300.0 / speedup),
        # holds for one-node jobs are due after this wait, in trace seconds as the simulator counts it
        "MIGSCHED_RESERVE_AFTER_S": repr(BalancerSettings.reserve_after_s / speedup),
        # the time alignment's buckets: minutes of trace time, as the simulator's
        "MIGSCHED_ALIGN_MINUTE_S": repr(BalancerSettings.align_minute_s / speedup),
    }


class StackError(MigschedError):
    """A stack process failed to start or died, or the stack did not become ready in time."""


def gpus_per_node(spec: str) -> int:
    """GPUs of each executor's ``MIGSCHED_EXECUTOR_GPUS`` (``MODEL[:COUNT[:MODE]],...``)."""
    from services.executor.config import parse_gpus

    return len(parse_gpus(spec))


@dataclass
class StackConfig:
    namespace: str = ""
    executors: int = 2
    gpus: str = f"{MODEL}:8"
    """Per executor: MODEL:COUNT[,...]."""
    reconfig_latency_s: float = 0.15
    executor_speedup: float = 1.0
    heartbeat_s: float = 1.0
    confirm_s: float = 1.0
    """Migration confirmation window of the executors (scaled down with a fast replay's clock)."""
    run_dir: Path = field(default_factory=lambda: Path.cwd() / ".run")
    env: dict[str, str] = field(default_factory=dict)
    """Extra MIGSCHED_* settings for every process (e.g. scaled cooldowns for a fast replay)."""
    metrics: bool = True
    """Give each process a free Prometheus port (listed in ``Stack.metrics_ports``); False: none."""
    stream_storage: str = "file"
    nodes_per_executor: int = 1
    """Simulated nodes per executor process (``MIGSCHED_NODES``): a bench of many nodes on few cores."""
    blocks: int = 0
    """Topology blocks the executors are spread over, in order (``MIGSCHED_NODE_LABELS=block=b<k>``); 0: no
    labels."""
    replicas: int = 1
    """Processes of each scheduling service (the second is named ``balancer-2``, ...): balancers race on the same
    shards through the compare-and-set, the registry's and the planner's replicas share their durable consumers."""


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.nats: LocalServer | None = None
        self.redis: LocalServer | None = None
        self.procs: list[Proc] = []
        self.metrics_ports: dict[str, int] = {}

    @property
    def nats_url(self) -> str:
        assert self.nats is not None
        return self.nats.url

    @property
    def redis_url(self) -> str:
        assert self.redis is not None
        return self.redis.url

    def nodes(self) -> list[str]:
        return [f"gpu-node-{i}" for i in range(self.config.executors)]

    def executor_groups(self) -> list[list[str]]:
        """The nodes of each executor process, in order (``nodes_per_executor`` at a time)."""
        nodes, per = self.nodes(), max(1, self.config.nodes_per_executor)
        return [nodes[i:i + per] for i in range(0, len(nodes), per)]

    def base_env(self) -> dict[str, str]:
        c = self.config
        env = {k: v for k, v in os.environ.items() if not k.startswith("MIGSCHED_")}
        env.update({k: v for k, v in os.environ.items() if k.startswith("MIGSCHED_")})
        pp = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + pp if pp else "")
        env.update(
            {
                "MIGSCHED_NATS_URL": self.nats_url,
                "MIGSCHED_REDIS_URL": self.redis_url,
                "MIGSCHED_NAMESPACE": c.namespace,
                "MIGSCHED_STREAM_STORAGE": c.stream_storage,
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(c.env)
        return env

    def plan(self) -> list[Proc]:
        """The processes, in start order: schedulers first (the node registry registers the nodes),
        executors."""
        c = self.config
        base = self.base_env()
        procs: list[Proc] = []
        for name in SCHEDULERS:
            for replica in range(1, max(1, c.replicas) + 1):
                label = name.replace("_", "-") + (f"-{replica}" if replica > 1 else "")
                procs.append(Proc(label, [sys.executable, "-m", f"services.{name}"], dict(base),
                                  c.run_dir / f"{label}.log"))
        groups = self.executor_groups()
        for k, group in enumerate(groups):
            node = group[0] if len(group) == 1 else f"{group[0]}..{group[-1]}"
            env = dict(base)
            if c.blocks > 0:
                env["MIGSCHED_NODE_LABELS"] = f"block=b{k * c.blocks // len(groups)}"
            env.update(
                {
                    "MIGSCHED_NODE": group[0],
                    "MIGSCHED_NODES": ",".join(group) if len(group) > 1 else "",
                    "MIGSCHED_EXECUTOR_BACKEND": "sim",
                    "MIGSCHED_EXECUTOR_GPUS": c.gpus,
                    "MIGSCHED_EXECUTOR_RECONFIG_LATENCY_S": repr(c.reconfig_latency_s),
                    "MIGSCHED_EXECUTOR_SPEEDUP": repr(c.executor_speedup),
                    "MIGSCHED_EXECUTOR_CONFIRM_S": repr(c.confirm_s),
                    "MIGSCHED_HEARTBEAT_S": repr(c.heartbeat_s),
                }
            )
            procs.append(
                Proc(
                    f"executor-{node}",
                    [sys.executable, "-m", "services.executor"],
                    env,
                    c.run_dir / f"executor-{node}.log",
                )
            )
        for p in procs:
            port = free_port() if c.metrics else 0
            p.env.setdefault("MIGSCHED_METRICS_PORT", str(port))
            if c.metrics:
                self.metrics_ports[p.name] = int(p.env["MIGSCHED_METRICS_PORT"])
        return procs

    # --- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        self.nats = resolve("nats")
        self.redis = resolve("redis")
        self.procs = self.plan()
        for p in self.procs:
            self._spawn(p)

    def _spawn(self, p: Proc) -> None:
        fh = p.log.open("ab")
        # own process group: a Ctrl-C in the terminal reaches `up` only, which then stops them in order
        p.popen = subprocess.Popen(
            p.argv, env=p.env, stdout=fh, stderr=subprocess.STDOUT, cwd=str(REPO), start_new_session=True
        )
        fh.close()

    def _respawn_port_clashes(self) -> None:
        """A free port picked here can be taken by another program before the service binds it: restart such a
        process on a new port (a few times) instead of failing the whole stack."""
        for p in self.dead():
            if p.restarts < 3 and self._port_taken(p):
                self._restart(p, "metrics port taken")

    def revive(self, limit: int = RESTARTS) -> list[str]:
        """Start again each process that died, as a supervisor would (systemd's Restart=on-failure, a
        Deployment's pods): one line per restart, saying how it ended. A process that died ``limit`` times is
        given up on (``StackError``): it fails on its own, not by accident."""
        said = []
        for p in self.dead():
            code = p.popen.returncode if p.popen else "?"
            if p.restarts >= limit:
                raise StackError(f"{p.name} exited with {code} {p.restarts + 1} times; giving up "
                                 f"(last log lines: {tail(p.log, 3)!r})")
            self._restart(p, f"exited with {code} ({p.restarts + 1} of {limit})")
            said.append(f"{p.name} exited with {code}; restarted ({p.restarts} of {limit})")
        return said

    def _port_taken(self, p: Proc) -> bool:
        return self.config.metrics and "Address already in use" in tail(p.log, 5)

    def _restart(self, p: Proc, why: str) -> None:
        """Start ``p`` again (on a new metrics port if its own was taken), counted, with a line in its log."""
        p.restarts += 1
        if self._port_taken(p):
            p.env["MIGSCHED_METRICS_PORT"] = str(free_port())
            self.metrics_ports[p.name] = int(p.env["MIGSCHED_METRICS_PORT"])
        with p.log.open("a") as fh:
            fh.write(f"--- {why}; restarting (metrics port {p.env.get('MIGSCHED_METRICS_PORT', '-')})\n")
        self._spawn(p)

    def dead(self) -> list[Proc]:
        return [p for p in self.procs if p.popen is not None and p.popen.poll() is not None]

    def check_alive(self) -> None:
        dead = self.dead()
        if dead:
            details = "; ".join(
                f"{p.name} exited with {p.popen.returncode if p.popen else '?'} "
                f"(last log lines: {tail(p.log, 3)!r})"
                for p in dead
            )
            raise StackError(f"stack process(es) died: {details}")

    def client_settings(self) -> Settings:
        """What a client of this stack needs: its servers, its namespace, and its shards (where the services put
        the nodes and jobs)."""
        return load(Settings, env={}, nats_url=self.nats_url, redis_url=self.redis_url,
                    namespace=self.config.namespace, shards=int(self.base_env().get("MIGSCHED_SHARDS") or "1"))

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the balancer consumes ``jobs.submit`` and every executor's GPUs are registered."""
        from shared.bus import JetStreamBus
        from shared.state import RedisState

        st = self.client_settings()
        bus = await JetStreamBus.connect(st, name="migsched-up")
        state = RedisState.from_settings(st)
        deadline = time.monotonic() + timeout
        try:
            while True:
                self._respawn_port_clashes()
                self.check_alive()
                if await self._ready(bus, state):
                    return
                if time.monotonic() > deadline:
                    raise StackError(
                        f"the stack was not ready within {timeout:.0f}s; see the logs in "
                        f"{self.config.run_dir}"
                    )
                await asyncio.sleep(0.2)
        finally:
            await state.close()
            await bus.close()

    async def _ready(self, bus: object, state: object) -> bool:
        from nats.js.errors import NotFoundError

        js = bus.js  # type: ignore[attr-defined]
        subjects = bus.subjects  # type: ignore[attr-defined]
        try:
            consumers = await js.consumers_info(subjects.stream_jobs)
        except NotFoundError:
            return False
        if not any(ci.config.filter_subject == subjects.jobs_submit for ci in consumers):
            return False
        nodes = await state.nodes()  # type: ignore[attr-defined]
        want = set(self.nodes())
        if not want <= {n for n, h in nodes.items() if h.get("state") == "up"}:
            return False
        per_node = gpus_per_node(self.config.gpus)
        return len(await state.gpu_ids()) >= per_node * len(want)  # type: ignore[attr-defined]

    def stop(self, grace_s: float = 10.0, servers: bool = True) -> dict[str, int | None]:
        """SIGTERM every process (executors first, so no new work starts), wait, SIGKILL what is left; stop
        the servers started here. Returns each process's exit status."""
        order = [p for p in self.procs if p.name.startswith("executor")] + [
            p for p in self.procs if not p.name.startswith("executor")
        ]
        for p in order:
            if p.popen is not None and p.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in order:
            if p.popen is None:
                continue
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(5)
        status = {p.name: (p.popen.returncode if p.popen else None) for p in self.procs}
        if servers:
            self.stop_servers()
        return status

    def stop_servers(self) -> None:
        """Stop the NATS/Redis servers started here (servers found running are left alone)."""
        for server in (self.nats, self.redis):
            if server is not None and server.owned:
                server.stop()


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop_event() -> asyncio.Event:
    """Set by SIGINT or SIGTERM: how a local stack (or its demo) is told to stop cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop
