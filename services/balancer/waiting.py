"""What the balancer knows of its queue without reading Redis, and when a backfill pass is wanted.

Exit and capacity signals coalesce into one pass per tick; the pass (a Redis read) is skipped while the queue is
known to be empty. The decoded specs of the jobs this replica queued are kept, so that a pass reads only the
queue's ids.
"""

from __future__ import annotations

import asyncio
from typing import Any

from shared.events import JobSubmit

MAX_REMEMBERED = 100_000


class Waiting:
    def __init__(self) -> None:
        self.specs: dict[str, tuple[JobSubmit, bytes, Any]] = {}
        self.maybe_nonempty = True
        self.wanted = asyncio.Event()

    def request(self, queue_grew: bool = False) -> None:
        """Ask for a backfill pass on the next tick; ``queue_grew``: something may have been queued meanwhile."""
        self.wanted.set()
        if queue_grew:
            self.maybe_nonempty = True

    def queued(self, sub: JobSubmit, spec: bytes, ctx: Any) -> None:
        self.maybe_nonempty = True
        if len(self.specs) < MAX_REMEMBERED:
            self.specs[sub.job_id] = (sub, spec, ctx)

    def left(self, job_id: str) -> None:
        self.specs.pop(job_id, None)

    def take_request(self) -> bool:
        """True once per requested pass, unless the queue is known to be empty."""
        if self.wanted.is_set() and self.maybe_nonempty:
            self.wanted.clear()
            return True
        return False
