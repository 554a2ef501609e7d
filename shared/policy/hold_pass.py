"""The holds one queue pass plans (``shared.policy.reservation``), in the pass's order.

A backfilling scheduler plans its reservations again at every pass over the queue: the oldest large jobs that
cannot be placed get the GPUs that free soonest, at most ``max_held`` of them, from at most twice as many plans
(so that a queue of large jobs costs a bounded number of plans), none on GPUs an earlier hold of the same pass
took. A job later in the pass may use a held GPU only when its hint says it ends before that hold's start
(``may_use``). The simulator's queue pass (``shared.sim.reserving``) and the balancer's backfill pass
(``services.balancer.holds``) both plan through this class.

Pure: the caller hands in the snapshot, the clock and each job's wait.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shared.policy.reservation import Reservation, ReservationParams, due, may_use, plan, plan_within
from shared.policy.snapshot import ClusterSnapshot


def closing(holds: Iterable[Reservation], hint_s: float | None, now: float, slack_s: float = 0.0,
            job_id: str | None = None) -> list[Reservation]:
    """The holds whose GPUs a job of this hint, starting now, may not use (``may_use``; never its own)."""
    return [r for r in holds if r.job_id != job_id and not may_use(hint_s, now, r.start, slack_s)]


def blocking(holds: Iterable[Reservation], hint_s: float | None, now: float, slack_s: float = 0.0,
             job_id: str | None = None) -> set[str]:
    """The GPUs of the holds ``closing`` to such a job."""
    return {g for r in closing(holds, hint_s, now, slack_s, job_id) for g in r.gpus}


def closed_by(holds: Iterable[Reservation], hint_s: float | None, now: float, slack_s: float = 0.0,
              job_id: str | None = None) -> str | None:
    """Why held GPUs are closed to a job, for its "why it waits": without it a job that waits beside free but
    held GPUs reads as if there were none. None when no hold closes a GPU to it."""
    closed = closing(holds, hint_s, now, slack_s, job_id)
    if not closed:
        return None
    names = [r.job_id for r in closed[:2]] + ([f"{len(closed) - 2} more"] if len(closed) > 2 else [])
    soonest = min(r.start for r in closed) - now
    after = f"more than {slack_s:g} s after that" if slack_s else "after that"
    why = "it has no duration hint" if hint_s is None else f"its hint ({hint_s:g} s) ends {after}"
    return (f"{sum(len(r.gpus) for r in closed)} GPU(s) held for {', '.join(names)} (expected start in "
            f"{max(0.0, soonest):.0f} s) are closed to it: {why}")


class HoldPass:
    """The holds of one pass (see the module docstring)."""

    def __init__(self, params: ReservationParams) -> None:
        self.params = params
        self.held: list[Reservation] = []
        self.taken: set[str] = set()
        """The GPUs the pass's holds took: a later hold of the pass plans around them."""
        self.tries = 0

    def blocking(self, hint_s: float | None, now: float, job_id: str | None = None) -> set[str]:
        """The held GPUs a job of this hint may not use now."""
        if not self.held:
            return set()
        return blocking(self.held, hint_s, now, self.params.slack_s, job_id)

    def wants(self, need: int, waited_s: float, spans_nodes: bool) -> bool:
        """Whether the pass plans a hold for a large job of ``need`` whole GPUs (``whole_gpus``; 0: not a large
        job) that has waited ``waited_s``: one is ``due`` and the pass still has room for a hold and a plan."""
        p = self.params
        return (bool(need) and len(self.held) < p.max_held and self.tries < 2 * p.max_held
                and due(p, waited_s, spans_nodes))

    def plan(self, snap: ClusterSnapshot, job_id: str, need: int, now: float, deadline: float,
             domains: Sequence[tuple[str, Sequence[str]]] | None = None, required: bool = False,
             plain: bool = False) -> Reservation | None:
        """One of the pass's plans, counted: the ``need`` GPUs that free soonest around the pass's holds, within
        one of ``domains`` for a gang kept within one (``plan_within``; ``required`` or preferred), on GPUs not
        in MIG mode too when ``plain`` (a ``gpus: n`` job); None when they would not free by ``deadline``. The
        caller ``add``s the hold it keeps."""
        self.tries += 1
        if domains is not None:
            return plan_within(snap, job_id, need, now, deadline, domains, required, self.taken, plain)
        return plan(snap, job_id, need, now, deadline, self.taken, plain=plain)

    def add(self, r: Reservation) -> None:
        self.held.append(r)
        self.taken.update(r.gpus)

    def drop(self, job_id: str) -> None:
        """The job was placed: its hold, if the pass planned one, is gone and its GPUs free for later holds."""
        if any(r.job_id == job_id for r in self.held):
            self.held = [r for r in self.held if r.job_id != job_id]
            self.taken = {g for r in self.held for g in r.gpus}
