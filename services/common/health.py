"""Each process's probes, served beside its metrics on ``MIGSCHED_METRICS_PORT``.

- ``/healthz`` (liveness): the process's event loop turned within ``stale_after_s``. A loop stuck on a call
  that never returns is what a restart cures.
- ``/readyz`` (readiness): live, started, every consumer and periodic task still running, and no consumer waiting
  out an outage of Redis or the bus (``shared.state.outage``). Not ready is not dead: an outage ends by itself.
- anything else: the Prometheus exposition of the process's registry.

The server is a daemon thread (as ``prometheus_client.start_http_server``); the loop only stamps its clock once
a second, and the thread reads the stamp and the service's ``readiness()``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

TICK_S = 1.0
STALE_AFTER_S = 30.0


class Probes:
    def __init__(self, stale_after_s: float = STALE_AFTER_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_after_s = stale_after_s
        self.clock = clock
        self._tick = clock()
        self.readiness: Callable[[], str | None] = lambda: "starting"
        """None when ready, else why not; the service sets it once it has started."""

    def tick(self) -> None:
        self._tick = self.clock()

    def live(self) -> str | None:
        late = self.clock() - self._tick
        return None if late < self.stale_after_s else f"the event loop has not turned for {late:.0f} s"

    def ready(self) -> str | None:
        return self.live() or self.readiness()

    async def keep_ticking(self, every_s: float = TICK_S) -> None:
        while True:
            self.tick()
            await asyncio.sleep(every_s)

    def app(self) -> Callable[[dict[str, Any], Any], Iterable[bytes]]:
        metrics = make_wsgi_app()

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path not in ("/healthz", "/readyz"):
                return metrics(environ, start_response)
            why = self.live() if path == "/healthz" else self.ready()
            body = b"ok\n" if why is None else why.encode() + b"\n"
            start_response("200 OK" if why is None else "503 Service Unavailable",
                           [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
            return [body]

        return app


def consumers_readiness(started: bool, consumers: Iterable[Any], tasks: Iterable[asyncio.Task[Any]],
                        stopping: bool) -> str | None:
    """Why a process that runs consumers and tasks is not ready, or None."""
    if not started:
        return "starting"
    if stopping:
        return "stopping"
    ended = [t.get_name() for t in list(tasks) if t.done()]
    if ended:
        return f"task(s) ended: {', '.join(ended)}"
    waiting = [c.durable for c in list(consumers) if c.pause_s > 0]
    if waiting:
        return f"waiting out an outage of Redis or the bus: {', '.join(waiting)}"
    return None


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # probes every few seconds are not news


def serve(port: int, probes: Probes, addr: str = "0.0.0.0") -> WSGIServer:
    """Start the probe and metrics endpoint on ``port`` (a daemon thread); the server, to ``shutdown()``."""
    server = make_server(addr, port, probes.app(), _Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name=f"probes:{port}", daemon=True).start()
    return server
