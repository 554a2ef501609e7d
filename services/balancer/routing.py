"""Which shard a new job lives in.

A job lives in its home shard (crc32 of its id): that spreads jobs evenly over the shards and lets every process
find one without a lookup. Two rules override it, each for a new job only, once, before any record of it exists
(``StateStore.route``). A job that no set of its home's GPUs could ever host (a gang bigger than the shard, a
per-node launch needing more GPUs out of MIG mode than it has, a required topology domain it lacks, a MIG request
with no GPU in MIG mode of a model that has its profile, a share with no time-sliced GPU), or whose
home holds no GPU while others do, goes to a shard that can host it: the one with the most empty GPUs
(``route_for``, here). A job its home cannot place now goes to a shard that can (``Decider._now_elsewhere``,
which decides on that shard's mirror). A large job (whole GPUs) that no shard can place now goes where it is
expected to start soonest, behind the large jobs queued there (``sooner_elsewhere``): a job waits in the shard it
was routed to, so a gang sent to a shard whose GPUs free in an hour would wait there while another's free in a
minute. A job no shard could ever host stays at home and is rejected there, with the reason.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import numpy.typing as npt

from services.balancer.mirror import Mirror
from services.balancer.shards import Shards
from shared.events import JobSubmit
from shared.mig.geometry import Geometry
from shared.policy.placement.gang import gang_capacity, never_fits
from shared.policy.placement.topology import never_within, only
from shared.policy.request import Demand, resolve_profile
from shared.policy.reservation import plan, whole_gpus
from shared.policy.reserve import free_full
from shared.policy.snapshot import ClusterSnapshot


def never_here(shards: Shards, shard: int, sub: JobSubmit) -> str | None:
    """Why no set of ``shard``'s GPUs could ever host ``sub`` (lost nodes' GPUs counted); None when some could,
    or while no node has registered there (nothing is known of it)."""
    mirror = shards.mirrors[shard]
    if sub.demand.kind != "gpus":
        return no_gpu_of_its_kind(mirror, sub.demand, shards.geometry) if len(mirror) else None
    view = mirror.view()
    why = bigger_than_shard(view, sub.demand, shard, shards.largest(), mirror.kinds().gang_room)
    if why is None and launches_per_node(sub):
        why = too_few_plain(shards, shard, sub.demand.gpus)
    if why is None:
        within = shards.within(shard, sub)
        if within.get("domain_required"):
            why = never_within_shard(view, sub.demand.gpus, within)
    return why


def no_gpu_of_its_kind(mirror: Mirror, demand: Demand, geometry: Geometry) -> str | None:
    """Why no GPU here could ever host a MIG request or a time-sliced share: none of its kind has registered
    (lost nodes' included; migsched never changes a GPU's MIG mode); None when one has."""
    kinds = mirror.kinds()
    if demand.kind == "shared":
        return None if kinds.shares else ("a time-sliced share needs a GPU not in MIG mode, time-sliced "
                                          "(MIGSCHED_EXECUTOR_GPUS ...:shared=N); none here is")
    if demand.kind != "mig":
        return None
    if any(resolve_profile(demand, geometry.model(m)) is not None for m in kinds.mig_models):
        return None
    if not kinds.mig_models:
        return f"{demand.label()} needs a GPU in MIG mode; none here is"
    return f"no GPU model in MIG mode here ({', '.join(sorted(kinds.mig_models))}) has a profile for {demand.label()}"


def route_for(shards: Shards, sub: JobSubmit, home: int) -> int | None:
    """The shard a new job should live in instead of its ``home``; None when it stays there (home can host it,
    or no shard can)."""
    if shards.count <= 1:
        return None
    sizes = [len(m) for m in shards.mirrors]
    if sizes[home] and never_here(shards, home, sub) is None:
        return None
    fits = [s for s in range(shards.count) if s != home and sizes[s] and never_here(shards, s, sub) is None]
    if not fits:
        return None
    return max(fits, key=lambda s: (empty_gpus(shards.mirrors[s].view()), -s))


def empty_gpus(snap: ClusterSnapshot) -> int:
    """Healthy GPUs that could take a full-size job now (``reserve.free_full``: shares of a plain GPU count)."""
    return int(free_full(snap).sum()) if len(snap) else 0


def bigger_than_shard(snap: ClusterSnapshot, demand: Demand, shard: int, largest: int,
                      here: int | None = None) -> str | None:
    """Why a gang can never run here: it needs more GPUs than its shard (a scheduling cell: one Lua script
    reserves a gang, so it runs within one shard) has ever registered, lost nodes' GPUs included; None when it
    could, or while no node has registered yet (nothing is known of the cluster). GPUs count by kind, in MIG mode
    or not, as a gang never mixes them (``gang_capacity``; ``here``: the shard's, when known). ``largest``: the
    GPUs of the largest shard so counted (0: one shard)."""
    if demand.kind != "gpus" or len(snap) == 0:
        return None
    here = gang_capacity(snap) if here is None else here
    why = never_fits(demand, len(snap), here)
    if why is None or not largest:
        return why
    if demand.gpus > largest:
        return f"needs {demand.gpus} GPUs; the largest shard has {largest} (a gang runs within one shard)"
    return f"needs {demand.gpus} GPUs; its shard {shard} has {here} (a gang runs within one shard)"


def launches_per_node(sub: JobSubmit) -> bool:
    """A gang whose workload starts once per node with all of that node's GPUs (``Workload.launch``)."""
    return sub.demand.kind == "gpus" and sub.demand.gpus > 1 and sub.workload.launch == "per-node"


def mig_gpus(snap: ClusterSnapshot) -> frozenset[str]:
    """The GPUs in MIG mode: a process sees one MIG device, so a per-node launch cannot use them."""
    return frozenset(g.id for g in snap.gpus if g.mig)


def too_few_plain(shards: Shards, shard: int, gpus: int) -> str | None:
    """Why a per-node gang can never run in ``shard``: fewer GPUs out of MIG mode than it needs (lost nodes'
    included; none while no node has registered there)."""
    def plain(s: int) -> int:
        view = shards.mirrors[s].view()
        return len(view) - len(mig_gpus(view))

    here = plain(shard)
    if not len(shards.mirrors[shard]) or here >= gpus:
        return None
    why = f"launch per-node needs {gpus} GPUs not in MIG mode (a process sees one MIG device); "
    if shards.count <= 1:
        return why + f"the cluster has {here}"
    most = max(plain(s) for s in range(shards.count))
    return why + (f"no shard has as many (the most: {most})" if most < gpus else f"its shard {shard} has {here}")


def never_within_shard(snap: ClusterSnapshot, gpus: int, within: dict[str, Any]) -> str | None:
    """Why a gang that requires one topology domain (``within``: its ``JobRequest`` domain fields) can never run
    here: every domain has fewer GPUs, lost nodes' included; None while no node has registered yet."""
    if len(snap) == 0:
        return None
    domain_of = {n: d for d, nodes in within["domains"] for n in nodes}
    sizes = Counter(domain_of[g.node] for g in snap.gpus if g.node in domain_of)
    return never_within(gpus, within["domain_level"], sizes)


Played = dict[tuple[int, bool, int], tuple[ClusterSnapshot, npt.NDArray[np.float64]]]
"""Per (shard, per-node launch, backlog version): the shard's GPUs and when each is expected free once its
backlog has run (``after_backlog``), kept for a round of decisions."""


def sooner_elsewhere(shards: Shards, home: int, sub: JobSubmit, now: float, played: Played | None = None) -> int | None:
    """The shard, other than ``home``, where a large new job that no shard can place now is expected to start
    soonest (``expected_start``), if that is sooner than at home by more than a second (the estimates rest on
    hints); None when home is as soon, or the job is small (it starts as soon as any instance frees, and holds
    nothing), or no start is known anywhere (running jobs without a duration hint)."""
    played = {} if played is None else played
    at_home = expected_start(shards, home, sub, now, played)
    if at_home is None:
        return None
    best, start = home, at_home
    for s in range(shards.count):
        if s == home or not len(shards.mirrors[s]) or never_here(shards, s, sub) is not None:
            continue
        t = expected_start(shards, s, sub, now, played)
        if t is not None and t < start - 1.0:
            best, start = s, t
    return None if best == home else best


AHEAD_PLANNED = 16
"""Large jobs queued ahead that an estimate plays out; a deeper queue is taken to start no sooner than that."""


def after_backlog(shards: Shards, shard: int, per_node: bool, now: float,
                  played: Played) -> tuple[ClusterSnapshot, npt.NDArray[np.float64]]:
    """The shard's GPUs (those out of MIG mode for a per-node launch) and when each is expected free once the
    large jobs queued there (its backlog) have each started on the GPUs that free soonest for them and run
    their hint (``reservation.plan``, a hold's rule); inf behind a job with no hint, or one that never starts."""
    backlog = shards.backlogs[shard]
    key = (shard, per_node, backlog.version)
    got = played.get(key)
    if got is not None:
        return got
    snap = shards.mirrors[shard].view()
    if per_node:
        snap = snap.without(mig_gpus(snap))
    free_at = np.maximum(snap.ends, now) if len(snap) else np.zeros(0)
    for a in backlog.ahead(AHEAD_PLANNED):
        r = plan(snap, a.job_id, a.need, now, math.inf, free_at=free_at, plain=a.plain)
        if r is None:  # a job ahead that never starts holds the queue: nothing after it is known
            free_at = np.full(len(snap), math.inf)
            break
        end = r.start + a.hint_s if a.hint_s is not None else math.inf
        free_at[[snap.position[g] for g in r.gpus]] = end
    played[key] = (snap, free_at)
    return snap, free_at


def expected_start(shards: Shards, shard: int, sub: JobSubmit, now: float,
                   played: Played | None = None) -> float | None:
    """When ``sub`` is expected to start in ``shard``: its whole GPUs there as they free once the shard's backlog
    has run (``after_backlog``), within one topology domain when it asks for one. inf: not expected before its
    deadline; None: too small a job to be held."""
    view = shards.mirrors[shard].view()
    need = whole_gpus(view.model_list, sub.demand) if len(view) else 0
    if need <= 0:
        return None
    snap, free_at = after_backlog(shards, shard, launches_per_node(sub), now, {} if played is None else played)
    deadline = sub.submitted_at + sub.patience_s if sub.patience_s is not None else math.inf
    within = shards.within(shard, sub)

    def start(part: ClusterSnapshot) -> float:
        """The soonest start on ``part`` of the shard (a domain's nodes, or all of them)."""
        free = free_at if part is snap else free_at[[snap.position[g.id] for g in part.gpus]]
        r = plan(part, sub.job_id, need, now, deadline, free_at=free, plain=sub.demand.kind == "gpus")
        return math.inf if r is None else r.start

    starts = [start(only(snap, nodes)) for _domain, nodes in within.get("domains", ())]
    if not starts or (min(starts) == math.inf and not within.get("domain_required")):
        starts.append(start(snap))  # a preferred domain: anywhere when none can
    return min(starts)
