"""Whether the connected nats-server can be trusted with replicated consumers.

Before 2.11, a replicated consumer (``MIGSCHED_STREAM_REPLICAS`` > 1) whose leader changed could skip a message:
its old leader handed the message to the client before its peers agreed that it was delivered, and the new leader,
on the client's ack of a later message, moved its start past it. A message lost in transit with the old leader's
server, or one whose handler failed and wanted it back, was then never delivered again. nats-server fixed this
over its 2.10.26-2.11 releases. migsched recovers what it can of such a loss: an executor's exit is repeated in
its heartbeats, a place command that goes unanswered times out and is decided again, the balancer reads back the
submits (the registry the cancels) stored around a change of its consumer's leader, and a node still running a
job that ended, was cancelled, was queued again or was placed elsewhere gets its stop again, as does the source
of a move whose target copy runs. Each recovery waits out a grace, and a skipped migration order or
``migrate_start`` is not recovered; so a replicated deployment wants 2.11 or later, and every service says so at
start when its server is older.
"""

from __future__ import annotations

import re

FIXED_IN = (2, 11)
_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


def parse(version: str) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of a server's version string, or None when it is not one."""
    m = _VERSION.match(version.strip())
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def replication_warning(version: str, replicas: int) -> str | None:
    """What to tell the operator when streams of ``replicas`` copies run on a server of ``version``; None when
    nothing is wrong (one copy has no consumer leader to lose, and 2.11 or later has the fix)."""
    if replicas <= 1:
        return None
    parsed = parse(version)
    if parsed is None:
        return (f"nats-server version {version!r} is unknown: with MIGSCHED_STREAM_REPLICAS={replicas}, a server "
                f"older than {FIXED_IN[0]}.{FIXED_IN[1]} can skip a message when a consumer's leader changes")
    if parsed[:2] >= FIXED_IN:
        return None
    return (f"nats-server {version} with MIGSCHED_STREAM_REPLICAS={replicas}: before {FIXED_IN[0]}.{FIXED_IN[1]}, "
            "a replicated consumer whose leader changes can skip a message it had delivered (migsched recovers "
            f"most such messages, late); run nats-server {FIXED_IN[0]}.{FIXED_IN[1]} or later")
