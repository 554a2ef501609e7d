"""Replicated servers on loopback ports for tests and ``migsched up --ha``: a NATS cluster (JetStream R3) and a
Redis primary with replicas behind Sentinel, and a Redis Cluster, started from the same binaries as
``localservers``."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from shared.localservers import LocalServer, ServerError, free_ports, start_redis, wait_answering


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
            wait_answering(s.url, s.proc, "nats-server")
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
            wait_answering(s.url, proc, "redis sentinel")
        rig = RedisSentinel(data, sentinels)
        rig.wait_ready()
        return rig
    except BaseException:
        for s in (*sentinels, *data):
            s.stop()
        raise


@dataclass
class RedisCluster:
    """A Redis Cluster of primaries, each with replicas (``start_redis_cluster``)."""

    nodes: list[LocalServer]

    @property
    def url(self) -> str:
        """``MIGSCHED_REDIS_URL`` for the cluster: every node as a seed."""
        return "redis+cluster://" + ",".join(urlparse(n.url).netloc for n in self.nodes)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def roles(self) -> dict[int, str]:
        """Each node's role now (index in ``nodes`` -> master | slave), as the nodes themselves say."""
        import redis as redis_sync

        out = {}
        for i, n in enumerate(self.nodes):
            with contextlib.suppress(Exception):
                r = redis_sync.Redis.from_url(n.url, socket_timeout=1.0, decode_responses=True)
                try:
                    out[i] = str(r.info("replication")["role"])
                finally:
                    r.close()
        return out

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every node says the cluster is ok and every replica is in sync."""
        import redis as redis_sync

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ok = 0
            for n in self.nodes:
                with contextlib.suppress(Exception):
                    r = redis_sync.Redis.from_url(n.url, socket_timeout=1.0, decode_responses=True)
                    try:
                        info = r.execute_command("CLUSTER", "INFO")
                        text = info if isinstance(info, str) else "\n".join(f"{k}:{v}" for k, v in info.items())
                        repl = r.info("replication")
                        synced = repl["role"] == "master" or repl.get("master_link_status") == "up"
                        ok += "cluster_state:ok" in text and synced
                    finally:
                        r.close()
            if ok == len(self.nodes):
                return
            time.sleep(0.2)
        raise ServerError(f"the Redis Cluster was not ready within {timeout:.0f}s")


def start_redis_cluster(workdir: Path, primaries: int = 3, replicas: int = 1,
                        node_timeout_ms: int = 1000) -> RedisCluster:
    """``primaries`` primaries sharing the 16,384 slots, each with ``replicas`` replicas, on loopback ports (AOF
    on); a primary silent for ``node_timeout_ms`` is failed over to its replica."""
    cli = shutil.which("redis-cli")
    if cli is None:
        raise ServerError("redis-cli is needed to form a Redis Cluster (apt-get install redis-tools)")
    nodes: list[LocalServer] = []
    try:
        count = primaries * (1 + replicas)
        ports = free_ports(2 * count)  # each node's own and its cluster bus port (not port + 10000: past 65535)
        for k in range(count):
            d = workdir / f"node-{k}"
            d.mkdir(parents=True, exist_ok=True)
            nodes.append(start_redis(ports[k], d, appendonly=True, extra=(
                "--cluster-enabled", "yes", "--cluster-config-file", str(d / "nodes.conf"),
                "--cluster-port", str(ports[count + k]), "--cluster-node-timeout", str(node_timeout_ms))))
        addresses = [urlparse(n.url).netloc for n in nodes]
        subprocess.run([cli, "--cluster", "create", *addresses, "--cluster-replicas", str(replicas),
                        "--cluster-yes"], check=True, capture_output=True, timeout=60)
        rig = RedisCluster(nodes)
        rig.wait_ready()
        return rig
    except BaseException:
        for n in nodes:
            n.stop()
        raise
