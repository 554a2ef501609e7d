"""Reservations for the head of the queue, EASY-backfill style: GPUs held for a waiting large job.

A *large* job needs whole GPUs: a full-size MIG instance or ``gpus: n``. Once a hold is ``due`` (one that fits
on one node has waited ``after_s`` without fitting; a gang bigger than every node at once), it gets the GPUs that
free soonest: on the node where its ``n``-th GPU frees first, by the expected ends of the jobs running there
(start + duration hint; the snapshot's ``ends`` column), leaving out the GPUs that small jobs share
(``hosts_small_jobs``: smaller MIG instances, time-sliced shares) unless no other GPUs would ever free for it. A
gang bigger than every node starts when the cluster's ``n``-th GPU frees, and of the GPUs free by then it holds
those busy longest on the fewest nodes (``plan_across``), so that the GPUs free now stay open meanwhile. A
``gpus: n`` job may be held on GPUs not in MIG mode too (``plan(plain=True)``). Other jobs may use a held GPU
only when their own hint says they end before the reservation's expected start; a job without a hint may not.
At most ``max_held`` reservations exist at once, and a job gets none when its GPUs would not free before its
patience runs out (holding them would idle them for nothing).

The rule is pure: the caller hands in the snapshot (and with it the expected ends) and the clock.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Collection, Sequence

import msgspec
import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel
from shared.mig.tables import tables_for
from shared.policy.placement.gang import choose_nodes, node_sizes
from shared.policy.placement.sharing import SHARE_PROFILE
from shared.policy.placement.topology import only
from shared.policy.request import Demand, full_profile, resolve_profile
from shared.policy.snapshot import ClusterSnapshot

ONE_NODE_AFTER_S = 1200.0
"""The default ``after_s`` (``MIGSCHED_RESERVE_AFTER_S``, ``migsched simulate --reserve-after``)."""


class ReservationParams(msgspec.Struct, frozen=True, kw_only=True):
    after_s: float = ONE_NODE_AFTER_S
    """A large job that fits on one node gets a reservation once it has waited this long without fitting; a
    gang bigger than every node gets one at once (``due``)."""
    max_held: int = 2
    """Reservations held at once (the oldest large jobs, in queue order). A queue pass plans for at most
    twice as many large jobs, so that a queue of them costs a bounded number of plans."""
    slack_s: float = 0.0
    """A job may take a held GPU if its hint says it ends at most this long after the hold's expected start
    (relaxed backfill: the held job may start up to this much later than planned, and the jobs behind it move
    sooner; docs/results.md). 0 = strict: only jobs that end before the start (EASY backfill)."""


def due(params: ReservationParams, waited_s: float, spans_nodes: bool) -> bool:
    """Whether a large job waiting for ``waited_s`` gets a hold now (``spans_nodes``: a gang bigger than every
    node, ``shared.policy.placement.gang.spans_nodes``). One that fits
    on one node waits ``after_s`` first, as Slurm's ``bf_min_age_reserve`` does: meanwhile it competes as any
    job and most find room as the queue moves, where a hold at once drains GPUs that small jobs then queue
    behind (docs/results.md). A gang bigger than every node is held at once: draining many nodes takes hours,
    so a later hold can only delay it."""
    return spans_nodes or waited_s >= params.after_s


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """GPUs held for one job from now until ``start``, when they are expected to be free."""

    job_id: str
    gpus: tuple[str, ...]
    node: str
    start: float
    reason: str
    nodes: tuple[str, ...] = ()
    """Every node of a gang that spans nodes (``node`` is the first); empty for a one-node reservation."""

    def explain(self, now: float | None = None) -> str:
        """Who holds which GPUs until when, and why. ``now``: when the GPUs are expected free is said from then
        ("expected free in 40 s"), not as a clock reading, and the reason keeps only what it adds to that."""
        where = ", ".join(self.nodes) if self.nodes else self.node
        head = f"{self.job_id}: {len(self.gpus)} GPU(s) on {where}"
        if now is None:
            return f"{head} held until ~{self.start:.0f} ({self.reason})"
        left = self.start - now
        when = "free now" if left < 0.5 else f"expected free in {left:.0f} s"
        rest = _PLANNED_WHEN.sub("", self.reason)
        return f"{head} held, {when}" + (f" ({rest})" if rest else "")


_PLANNED_WHEN = re.compile(r"^(free now|expected free in \d+ s)[;,]?\s*")
"""The start of a plan's reason that says when its GPUs free, as seen when it was planned."""


def whole_gpus(models: Sequence[GpuModel], demand: Demand) -> int:
    """How many whole GPUs the demand needs on a cluster of ``models`` (a snapshot's ``model_list``): ``n`` for
    ``gpus: n``, 1 for a full-size MIG profile, else 0."""
    if demand.kind == "gpus":
        return demand.gpus
    if demand.kind != "mig":
        return 0
    for model in models:
        prof = resolve_profile(demand, model)
        if prof is not None and prof.memory_slices == full_profile(model).memory_slices:
            return 1
    return 0


def expected_run(hint_s: float | None, default_s: float) -> float | None:
    """How long a job is expected to run, for planning holds on its GPU: its hint, else the default expected run
    (``MIGSCHED_DEFAULT_HINT_S``; 0 = none), else None (its end is unknown and no hold counts on its GPU). Only
    planning reads the default: a job without a hint still may not use held GPUs (``may_use``)."""
    return hint_s if hint_s is not None else (default_s or None)


def may_use(hint_s: float | None, now: float, held_until: float, slack_s: float = 0.0) -> bool:
    """Whether a job that would start now may take a GPU held until ``held_until``: only if its hint says it
    ends by then, or at most ``slack_s`` later (``ReservationParams.slack_s``)."""
    return hint_s is not None and now + hint_s <= held_until + slack_s


def plan_within(
    snap: ClusterSnapshot,
    job_id: str,
    need: int,
    now: float,
    deadline: float,
    domains: Sequence[tuple[str, Sequence[str]]],
    required: bool,
    taken: Collection[str] = (),
    plain: bool = False,
) -> Reservation | None:
    """``plan`` for a gang kept within one topology domain: each domain alone, the earliest start winning (ties:
    the first domain); with none, a ``required`` gang gets no hold and a preferred one is held anywhere."""
    best: Reservation | None = None
    for _name, nodes in domains:
        r = plan(only(snap, nodes), job_id, need, now, deadline, taken, plain=plain)
        if r is not None and (best is None or r.start < best.start):
            best = r
    if best is None and not required:
        return plan(snap, job_id, need, now, deadline, taken, plain=plain)
    return best


def plan(
    snap: ClusterSnapshot,
    job_id: str,
    need: int,
    now: float,
    deadline: float,
    taken: Collection[str] = (),
    free_at: npt.NDArray[np.float64] | None = None,
    plain: bool = False,
) -> Reservation | None:
    """The ``need`` usable GPUs on one node that are expected to be free soonest, leaving out ``taken`` (held
    by earlier reservations). ``free_at`` (per snapshot position) defaults to the snapshot's expected ends
    (``ClusterSnapshot.ends``; now for a GPU with no busy instance, never for one running a job without a
    hint). None when no node has ``need`` such GPUs or they would not be free by ``deadline``. Ties go to the
    node whose hold idles fewer GPU-seconds, then to the node of the GPU first in snapshot order. A gang bigger
    than every node is held across nodes (``plan_across``). GPUs running small jobs are left out while the
    other GPUs would free for the job at all (in time or not: too late means no hold).

    ``plain``: the job (``gpus: n``) may run on GPUs not in MIG mode too. A gang's members are all of one kind,
    so each kind is planned apart and the earlier start wins; on a tie the plain GPUs, which placement tries
    first."""
    if need <= 0 or not len(snap):
        return None
    mig = _plan_on(snap, job_id, need, now, deadline, taken, free_at, np.array(snap.ok, dtype=bool),
                   node_sizes(snap, mig=True))
    if not plain:
        return mig
    usable = ~np.asarray(snap.mig, dtype=bool) & np.asarray(snap.healthy, dtype=bool)
    if not usable.any():
        return mig
    whole = _plan_on(snap, job_id, need, now, deadline, taken, free_at, usable, node_sizes(snap, mig=False))
    if whole is None or (mig is not None and mig.start < whole.start):
        return mig
    return whole


def _plan_on(
    snap: ClusterSnapshot,
    job_id: str,
    need: int,
    now: float,
    deadline: float,
    taken: Collection[str],
    free_at: npt.NDArray[np.float64] | None,
    ok: npt.NDArray[np.bool_],
    sizes: npt.NDArray[np.intp],
) -> Reservation | None:
    """``plan`` over the GPUs ``ok`` marks usable (a copy, changed here), all of one kind; ``sizes``: each node's
    GPUs of that kind (a gang more than every node has spans nodes)."""
    for g in taken:
        p = snap.position.get(g)
        if p is not None:
            ok[p] = False
    pos = np.flatnonzero(ok)
    if pos.size < need:
        return None
    free = np.maximum(snap.ends if free_at is None else free_at, now)[pos]
    shared = hosts_small_jobs(snap)
    small = shared[pos]
    if small.any():
        # a hold drains what it takes, and draining the GPUs small jobs share queues the small jobs that would
        # fit in their free slices: while other GPUs are expected to free for the job at all, only they are
        # held, and when they would free too late the job gets no hold
        keep = ~small
        r = _soonest(snap, job_id, need, now, math.inf, pos[keep], free[keep], sizes)
        if r is not None:
            return r if r.start <= deadline else None
        r = _soonest(snap, job_id, need, now, deadline, pos, free, sizes)
        if r is not None and shared[[snap.position[g] for g in r.gpus]].any():
            return msgspec.structs.replace(r, reason=f"{r.reason}; holds GPUs small jobs share: no others ever free")
        return r
    return _soonest(snap, job_id, need, now, deadline, pos, free, sizes)


def hosts_small_jobs(snap: ClusterSnapshot) -> npt.NDArray[np.bool_]:
    """Per GPU: a MIG GPU running a job in an instance smaller than the whole GPU, or a GPU not in MIG mode
    running time-sliced shares."""
    mig = np.asarray(snap.mig, dtype=bool)
    small: npt.NDArray[np.bool_] = (np.asarray(snap.busy) != 0) & mig
    if small.any():
        full = _full_columns(tuple(snap.model_list))
        small &= snap.busy_starts[np.arange(len(snap)), full[np.asarray(snap.model_idx, dtype=np.intp)]] == 0
    if not mig.all():  # a share's instance takes no slice: read the plain GPUs that run a job
        for p in np.flatnonzero(~mig & (np.asarray(snap.ends) > -math.inf)).tolist():
            small[p] = any(i.job_id is not None and i.profile == SHARE_PROFILE for i in snap.gpus[p].instances)
    return small


@functools.cache
def _full_columns(models: tuple[GpuModel, ...]) -> npt.NDArray[np.intp]:
    """Per model of a snapshot, the column of its whole-GPU profile in ``busy_starts``."""
    return np.array([tables_for(m).index[full_profile(m).name] for m in models], dtype=np.intp)


def _soonest(
    snap: ClusterSnapshot,
    job_id: str,
    need: int,
    now: float,
    deadline: float,
    pos: npt.NDArray[np.intp],
    free: npt.NDArray[np.float64],
    sizes: npt.NDArray[np.intp],
) -> Reservation | None:
    """``plan`` over the usable positions ``pos``, each expected free at ``free`` (``sizes``: each node's GPUs of
    their kind)."""
    if pos.size < need:
        return None
    if need > int(sizes.max()):
        return plan_across(snap, job_id, need, now, deadline, pos, free, sizes)
    nodes = np.asarray(snap.node_idx)[pos]
    order = np.lexsort((pos, free, nodes))  # by node, then free time, then position
    t, n, p_sorted = free[order], nodes[order], pos[order]
    # plain concatenations: np.r_ parses its index each call, and a plan runs at every queue pass on a busy
    # cluster
    first = np.flatnonzero(np.concatenate(([True], n[1:] != n[:-1])))
    counts = np.diff(first, append=n.size)
    big = counts >= need
    if not big.any():
        return None
    heads = first[big]
    last = heads + need - 1
    start = t[last]
    finite = np.isfinite(start)
    if not finite.any():
        return None
    heads, last, start = heads[finite], last[finite], start[finite]
    # GPU-seconds the chosen GPUs wait, each from its own free time; summed per node rather than as differences
    # of one running sum, whose rounding would part nodes that free alike and break their tie by position
    idle = (start[:, None] - t[heads[:, None] + np.arange(need)]).sum(axis=1)
    k = int(np.lexsort((p_sorted[heads], idle, start))[0])
    if start[k] > deadline:
        return None
    chosen = p_sorted[heads[k]: last[k] + 1].tolist()
    gpus = tuple(snap.gpus[q].id for q in chosen)
    at = float(start[k])
    reason = "free now" if at <= now else f"expected free in {at - now:.0f} s"
    return Reservation(job_id=job_id, gpus=gpus, node=snap.gpus[chosen[0]].node, start=at, reason=reason)


def plan_across(
    snap: ClusterSnapshot,
    job_id: str,
    need: int,
    now: float,
    deadline: float,
    pos: npt.NDArray[np.intp],
    free: npt.NDArray[np.float64],
    sizes: npt.NDArray[np.intp],
) -> Reservation | None:
    """``need`` GPUs across nodes for a gang bigger than every node, from the usable positions ``pos`` and
    when each is expected free (``free``): the expected start is when the ``need``-th GPU of the cluster frees,
    and of the GPUs free by then the gang's node rule (``shared.policy.placement.gang.choose_nodes``) picks the nodes,
    the GPUs busy longest (yet free by then) first on each: a GPU free now and held would idle until the start,
    closed to the jobs that do not end first, so among nodes alike those with fewer GPUs free now go first.
    ``sizes``: each node's GPUs of the kind planned."""
    order = np.lexsort((pos, free))
    at = float(free[order[need - 1]])
    if not np.isfinite(at) or at > deadline:
        return None
    ready = order[free[order] <= at]
    nodes = np.asarray(snap.node_idx)[pos[ready]]
    count = np.bincount(nodes, minlength=sizes.size)
    free_now = np.bincount(nodes[free[ready] <= now], minlength=sizes.size)
    chosen = choose_nodes(count.tolist(), (count == sizes).tolist(), need, prefer=free_now.tolist())
    assert chosen is not None  # ``ready`` holds at least ``need`` GPUs
    late = np.lexsort((pos[ready], -free[ready]))  # within ``ready``: busy longest first
    by_late, late_nodes = ready[late], nodes[late]
    picked = np.concatenate([by_late[late_nodes == j][:take] for j, take in chosen])  # indices into ``pos``
    gpus = tuple(snap.gpus[q].id for q in pos[picked].tolist())
    start = at  # any ``need`` of the GPUs free by ``at`` include one that frees only then
    node_names = tuple(dict.fromkeys(snap.gpus[q].node for q in pos[picked].tolist()))
    reason = "free now" if start <= now else f"expected free in {start - now:.0f} s"
    return Reservation(job_id=job_id, gpus=gpus, node=node_names[0], start=start, reason=reason, nodes=node_names)
