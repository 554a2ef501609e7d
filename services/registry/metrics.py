"""The node registry's Prometheus metrics: command results, nodes by state, the retention sweep."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

COMMANDS = Counter(
    "migsched_commands_total",
    "Executor command results as the node registry saw them, by kind and outcome (done, failed, timeout); "
    "what was sent is migsched_messages_published_total",
    ["kind", "outcome"],
)
NODES = Gauge("migsched_nodes", "Nodes by state (up, lost)", ["state"])
JOBS_EXPIRED = Counter(
    "migsched_jobs_expired_total", "Ended jobs deleted from Redis by the retention sweep (age or cap)"
)
MISSED_EXITS = Counter(
    "migsched_registry_missed_exits_total",
    "Exit reports the registry's consumer never delivered, applied from the heartbeat that repeated them",
)
MISSED_CANCELS = Counter(
    "migsched_registry_missed_cancels_total",
    "Cancels the registry's durable consumer skipped across a change of its leader, applied when read back",
)
MOVES_RESUMED = Counter(
    "migsched_registry_moves_resumed_total",
    "Moves whose target copy ran a command time-out without the move completing, given their source's "
    "migrate_stop again",
)
STRAY_STOPS = Counter(
    "migsched_registry_stray_stops_total",
    "Stop commands sent again for runs a node still reported a command time-out after their job ended, was "
    "cancelled, was queued again or was placed on other nodes",
)
