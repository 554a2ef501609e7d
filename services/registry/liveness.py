"""When the node registry may call a silent node lost.

The registry judges a node by the heartbeats it *received*, so silence only counts while it could have heard
the node. Calling a node lost because the bus was down re-queues jobs its executor keeps running (a
NATS restart under load would end jobs ``failed``). The rules:

1. While the registry's own NATS connection is down, no node is declared lost.
2. When it comes back, every node gets a fresh ``node_timeout_s``: silence counts from the later of the
   node's last heartbeat and the reconnect.
3. When the heartbeat consumer received nothing from any node for ``node_timeout_s`` although the connection
   stayed up (a stalled consumer, JetStream still recovering its streams, the registry starved of CPU), the
   registry suspects its own side rather than every node at once: it judges nobody until that silence reaches
   2 x ``node_timeout_s`` (if every node really died, they are lost one timeout later than usual), and the
   first heartbeat after such a silence is a comeback as in rule 2.
"""

from __future__ import annotations

from shared.bus import BusHealth


class LivenessWatch:
    """The registry's view of its own hearing, in ``time.monotonic()`` seconds."""

    __slots__ = ("back_at", "heard_at", "timeout")

    def __init__(self, timeout: float, now: float) -> None:
        self.timeout = timeout
        self.heard_at = now
        """When the heartbeat consumer last received anything (from any node); the start counts as heard."""
        self.back_at = now
        """Since when the registry could hear nodes (start, or the end of a silence of its own)."""

    def heard(self, now: float) -> None:
        if now - self.heard_at >= self.timeout:
            self.back_at = max(self.back_at, now)
        self.heard_at = now

    def silence_from(self, health: BusHealth | None, now: float) -> float | None:
        """The monotonic time before which a node's silence does not count, or None: judge nobody now."""
        back = self.back_at
        if health is not None:
            if not health.connected:
                return None
            back = max(back, health.since)
        if self.timeout <= now - self.heard_at < 2 * self.timeout:
            return None
        return back


def overdue(last_seen: float, now: float, timeout: float, heard_from: float | None) -> bool:
    """Whether a node last seen at ``last_seen`` (wall clock) is lost at ``now``, or a command sent at
    ``last_seen`` has waited too long for its result; ``heard_from`` is the wall time from which silence counts
    (``LivenessWatch.silence_from`` converted), None to judge nobody. The same rule serves both: a result
    queued behind a bus outage is as unheard as a heartbeat."""
    if heard_from is None:
        return False
    return max(last_seen, heard_from) < now - timeout
