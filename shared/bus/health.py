"""Whether this process's NATS connection is up, and since when.

A service that judges others by the messages it receives (the node registry and its heartbeats) must know
when silence is its own: while its connection is down, or just after it came back, nobody could have reached
it. nats-py reports disconnects and reconnects through callbacks; ``BusHealth`` keeps their outcome.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

Callback = Callable[[], Awaitable[None]]
log = logging.getLogger("migsched.bus")
ERROR_LOG_EVERY_S = 30.0


class BusHealth:
    """``connected``: the connection is up now; ``since``: ``time.monotonic()`` of the last change (connect,
    disconnect or reconnect); ``outages``: how many times it went down."""

    __slots__ = ("_chained", "_errors", "connected", "last_error", "outages", "since")

    def __init__(self, connected: bool = True) -> None:
        self.connected = connected
        self.since = time.monotonic()
        self.outages = 0
        self.last_error = ""
        """The connection's last error, as one line (``BusError`` quotes it when a client gives up)."""
        self._chained: dict[str, Callback | None] = {}
        self._errors: dict[str, tuple[float, int]] = {}
        """Per kind of error: when it was last logged, and how many came since."""

    async def on_error(self, exc: Exception) -> None:
        """One warning line per kind of error, at most one every ``ERROR_LOG_EVERY_S`` with a count of the
        others: nats-py's own callback logs a traceback at each retry, two a second while a server is down."""
        kind = type(exc).__name__
        self.last_error = f"{kind}: {exc}" if str(exc) else kind
        logged_at, since = self._errors.get(kind, (-ERROR_LOG_EVERY_S, 0))
        now = time.monotonic()
        if now - logged_at < ERROR_LOG_EVERY_S:
            self._errors[kind] = (logged_at, since + 1)
            return
        log.warning("NATS: %s%s", self.last_error, f" ({since} more since the last report)" if since else "")
        self._errors[kind] = (now, 0)

    def up_for(self, now: float | None = None) -> float:
        """Seconds the connection has been up without a break (0 while it is down)."""
        if not self.connected:
            return 0.0
        return (time.monotonic() if now is None else now) - self.since

    async def on_disconnected(self) -> None:
        if self.connected:
            self.connected = False
            self.outages += 1
            self.since = time.monotonic()
        await self._chain("disconnected_cb")

    async def on_reconnected(self) -> None:
        self.connected = True
        self.since = time.monotonic()
        await self._chain("reconnected_cb")

    async def _chain(self, name: str) -> None:
        cb = self._chained.get(name)
        if cb is not None:
            await cb()

    def options(self, options: dict[str, Any]) -> dict[str, Any]:
        """``nats.connect`` options with our callbacks in place; a caller's own callbacks still run after."""
        self._chained = {k: options.pop(k, None) for k in ("disconnected_cb", "reconnected_cb")}
        options.setdefault("error_cb", self.on_error)
        return {**options, "disconnected_cb": self.on_disconnected, "reconnected_cb": self.on_reconnected}
