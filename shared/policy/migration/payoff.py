"""Whether moving a running job can pay off, from how long it is expected to run on.

A move costs the job a stop and a restart from its last checkpoint and costs the cluster a reconfiguration and
a message round on two nodes; what it buys is room (lower fragmentation) for the jobs that come next. A job that
ends within ``min_left_s`` gives that room back by its exit about as soon as the move would, so it is left
where it is. Jobs without a duration hint are never screened out: nothing says they end soon.
"""

from __future__ import annotations

__all__ = ["pays_off", "time_left"]


def time_left(duration_hint_s: float | None, started_at: float, now: float) -> float | None:
    """Seconds the job is expected to run on: its hint less what it has run (``started_at`` > 0, else the whole
    hint); None without a hint."""
    if duration_hint_s is None:
        return None
    ran = now - started_at if started_at > 0 else 0.0
    return max(0.0, duration_hint_s - max(0.0, ran))


def pays_off(left_s: float | None, min_left_s: float) -> bool:
    """True when a job expected to run ``left_s`` more seconds (None: unknown) is worth moving."""
    return left_s is None or min_left_s <= 0 or left_s >= min_left_s
