"""The balancer's reservations of one shard: GPUs held for large waiting jobs (``shared.policy.reservation``).

Planned again at every backfill pass, in the queue's order, from the mirror (whose instances carry their
jobs' expected ends), exactly as the simulator's queue pass does: a job later in the pass, and every fresh
submit until the next pass, sees a held GPU as unusable unless its hint says it ends before the hold's start.
The pass's result is written to Redis for ``migsched status`` (``StateStore.put_holds``); being derived from
the queue and the cluster, it needs no recovery: a restarted balancer plans the same holds at its first pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from shared.events import JobSubmit
from shared.policy.placement.gang import spans_nodes
from shared.policy.reservation import (
    Reservation,
    ReservationParams,
    due,
    may_use,
    plan,
    plan_within,
    whole_gpus,
)
from shared.policy.snapshot import ClusterSnapshot


class Holds:
    def __init__(self, params: ReservationParams) -> None:
        self.params = params
        self.current: list[Reservation] = []
        """As the last finished pass planned them."""
        self._next: list[Reservation] | None = None
        self._attempts = 0

    @property
    def active(self) -> list[Reservation]:
        return self._next if self._next is not None else self.current

    def begin(self) -> None:
        """A backfill pass starts: holds are planned anew in its order."""
        self._next, self._attempts = [], 0

    def end(self) -> list[Reservation]:
        if self._next is not None:
            self.current, self._next = self._next, None
        return self.current

    def blocked(self, job_id: str, hint_s: float | None, now: float) -> set[str]:
        """The held GPUs this job may not use (none of its own hold)."""
        slack = self.params.slack_s
        return {g for r in self.active if r.job_id != job_id and not may_use(hint_s, now, r.start, slack)
                for g in r.gpus}

    def consider(self, snap: ClusterSnapshot, sub: JobSubmit, now: float,
                 domains: Sequence[tuple[str, Sequence[str]]] = (), required: bool = False) -> Reservation | None:
        """During a pass: a hold for a large job that could not be placed, if one is due and possible;
        ``domains``: a gang kept within one topology domain is held within one (``plan_within``)."""
        if self._next is None or len(self._next) >= self.params.max_held:
            return None
        if self._attempts >= 2 * self.params.max_held:
            return None
        need = whole_gpus(snap.model_list, sub.demand)
        if not need or not due(self.params, now - sub.submitted_at, spans_nodes(snap, sub.demand)):
            return None
        self._attempts += 1
        deadline = sub.submitted_at + sub.patience_s if sub.patience_s is not None else math.inf
        taken = {g for r in self._next for g in r.gpus}
        r = (plan_within(snap, sub.job_id, need, now, deadline, domains, required, taken) if domains
             else plan(snap, sub.job_id, need, now, deadline, taken))
        if r is not None:
            self._next.append(r)
        return r

    def placed(self, job_id: str) -> None:
        for holds in (self.current, self._next):
            if holds is not None:
                holds[:] = [r for r in holds if r.job_id != job_id]
