"""How long the planner waits before its next after-exit pass.

Every pass reads and decodes the whole shard, whatever it finds. Where passes keep finding nothing worth moving
(jobs too short to move, a cluster with no fragmentation to heal), reading the shard every ``plan_interval_s``
only spends CPU and Redis time that placements need, so each fruitless pass in a row doubles the wait, up to
``plan_interval_max_s``. Exits are kept meanwhile and planned together at the next pass; the first pass that
orders a move goes back to the shortest wait.
"""

from __future__ import annotations


def next_wait(fruitless: int, base_s: float, cap_s: float) -> float:
    """Seconds from one after-exit pass to the next, after ``fruitless`` passes in a row that ordered nothing."""
    if fruitless <= 0 or cap_s <= base_s:
        return base_s
    return min(cap_s, base_s * 2.0 ** min(fruitless, 32))
