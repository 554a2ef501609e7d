"""The balancer's reservations of one shard: GPUs held for large waiting jobs (``shared.policy.reservation``).

Planned again at every backfill pass, in the queue's order, from the mirror (whose instances carry their
jobs' expected ends), by the simulator's rule (``shared.policy.hold_pass.HoldPass``): a job later in the pass,
and every fresh submit until the next pass, sees a held GPU as unusable unless its hint says it ends before the
hold's start.
The pass's result is written to Redis for ``migsched status`` (``StateStore.put_holds``); being derived from
the queue and the cluster, it needs no recovery: a restarted balancer plans the same holds at its first pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from shared.events import JobSubmit
from shared.policy.hold_pass import HoldPass, blocking, closed_by
from shared.policy.placement.gang import spans_nodes
from shared.policy.reservation import Reservation, ReservationParams, whole_gpus
from shared.policy.snapshot import ClusterSnapshot


class Holds:
    def __init__(self, params: ReservationParams) -> None:
        self.params = params
        self.current: list[Reservation] = []
        """As the last finished pass planned them."""
        self._pass: HoldPass | None = None

    @property
    def active(self) -> list[Reservation]:
        return self._pass.held if self._pass is not None else self.current

    def begin(self) -> None:
        """A backfill pass starts: holds are planned anew in its order."""
        self._pass = HoldPass(self.params)

    def end(self) -> list[Reservation]:
        if self._pass is not None:
            self.current, self._pass = self._pass.held, None
        return self.current

    def blocked(self, job_id: str, hint_s: float | None, now: float) -> set[str]:
        """The held GPUs this job may not use (none of its own hold)."""
        return blocking(self.active, hint_s, now, self.params.slack_s, job_id)

    def closed_to(self, job_id: str, hint_s: float | None, now: float) -> str | None:
        """Why ``blocked`` holds GPUs back from this job, for its reason; None when it holds none back."""
        return closed_by(self.active, hint_s, now, self.params.slack_s, job_id)

    def consider(self, snap: ClusterSnapshot, sub: JobSubmit, now: float,
                 domains: Sequence[tuple[str, Sequence[str]]] = (), required: bool = False) -> Reservation | None:
        """During a pass: a hold for a large job that could not be placed, if one is due and possible;
        ``domains``: a gang kept within one topology domain is held within one (``plan_within``)."""
        p = self._pass
        if p is None:
            return None
        need = whole_gpus(snap.model_list, sub.demand)
        if not p.wants(need, now - sub.submitted_at, spans_nodes(snap, sub.demand)):
            return None
        deadline = sub.submitted_at + sub.patience_s if sub.patience_s is not None else math.inf
        r = p.plan(snap, sub.job_id, need, now, deadline, domains or None, required, sub.demand.kind == "gpus")
        if r is not None:
            p.add(r)
        return r

    def placed(self, job_id: str) -> None:
        self.current = [r for r in self.current if r.job_id != job_id]
        if self._pass is not None:
            self._pass.drop(job_id)
