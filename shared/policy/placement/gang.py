"""Gangs across nodes: ``gpus: n`` larger than any node, placed all or nothing on as few nodes as possible.

A gang that fits on one node (as many GPUs of one kind, in MIG mode or not) stays on one node, placed by the
policy's own rule. A larger one spans nodes, by one rule shared by every policy (the registry applies it), as
topology-aware batch schedulers do (Kueue TAS's BestFit, Slurm's fewest-nodes):

1. the fewest nodes whose empty GPUs add up to ``n``;
2. for the bulk, the nodes with the most empty GPUs, nodes whose GPUs of the kind are all empty before others
   at a tie (the gang takes them whole and leaves no node half used);
3. for the rest, the node with the fewest empty GPUs that still holds it (the tightest fit).

Members are full-size MIG instances on empty MIG GPUs or whole plain (non-MIG) GPUs, never a mix of the two,
one member per GPU. The slots come in rank order: node by node in the order chosen, GPUs by index, so the
first slot is rank 0 and its node the rendezvous host.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shared.mig.geometry import Geometry
from shared.policy.placement.decision import CannotPlace, Decision, JobRequest, Placement, Slot
from shared.policy.placement.sharing import is_free_plain, whole_slot
from shared.policy.placement.slots import full_slot
from shared.policy.request import Demand, full_profile
from shared.policy.snapshot import ClusterSnapshot, GpuView


def node_sizes(snap: ClusterSnapshot, mig: bool) -> npt.NDArray[np.intp]:
    """Per node (indexed as ``ClusterSnapshot.node_idx``), its GPUs in MIG mode (``mig``) or not. Every registered
    GPU counts, healthy or not."""
    if not len(snap):
        return np.zeros(1, dtype=np.intp)
    nodes = np.asarray(snap.node_idx)
    return np.bincount(nodes[np.asarray(snap.mig, dtype=bool) == mig], minlength=int(nodes.max()) + 1)


def node_capacity(snap: ClusterSnapshot) -> npt.NDArray[np.intp]:
    """Per node, the most members a gang could have there: its GPUs of one kind, in MIG mode or not (a gang
    never mixes the two)."""
    return np.maximum(node_sizes(snap, mig=True), node_sizes(snap, mig=False))


def spans_nodes(snap: ClusterSnapshot, demand: Demand) -> bool:
    """Whether the demand is a gang that no node of the cluster could ever hold (more GPUs than any node has of
    one kind), so it must span nodes."""
    return demand.kind == "gpus" and demand.gpus > int(node_capacity(snap).max())


def gang_capacity(snap: ClusterSnapshot) -> int:
    """The most GPUs one gang could ever hold in the cluster: those of its larger kind, in MIG mode or not."""
    mig = int(np.asarray(snap.mig, dtype=bool).sum()) if len(snap) else 0
    return max(mig, len(snap) - mig)


def never_fits(demand: Demand, cluster_gpus: int, of_one_kind: int | None = None) -> str | None:
    """Why no set of nodes in a cluster of ``cluster_gpus`` GPUs, ``of_one_kind`` of them of its larger kind
    (``gang_capacity``; default: all), could ever host the demand (None: some could)."""
    cap = cluster_gpus if of_one_kind is None else of_one_kind
    if demand.kind != "gpus" or demand.gpus <= cap:
        return None
    if cap < cluster_gpus:
        return (f"needs {demand.gpus} GPUs of one kind; the cluster has {cluster_gpus}, at most {cap} of one kind "
                "(a gang never mixes GPUs in MIG mode with others)")
    return f"needs {demand.gpus} GPUs; the cluster has {cluster_gpus}"


def choose_nodes(free: Sequence[int], whole: Sequence[bool], n: int, prefer: Sequence[int] | None = None,
                 ) -> list[tuple[int, int]] | None:
    """``(node, GPUs taken there)`` for ``n`` GPUs over nodes with ``free[j]`` usable GPUs (``whole[j]``: all of
    node ``j``'s GPUs are free), by the module's rule; None when they add up to fewer than ``n``. ``prefer``: between
    nodes that the rule ranks alike, the lower ``prefer[j]`` goes first (default: the lower index)."""
    pref = prefer if prefer is not None else [0] * len(free)
    order = sorted((j for j in range(len(free)) if free[j] > 0), key=lambda j: (-free[j], not whole[j], pref[j], j))
    total, k = 0, 0
    while k < len(order) and total < n:
        total += free[order[k]]
        k += 1
    if total < n:
        return None
    bulk = order[: k - 1]
    rest = n - sum(free[j] for j in bulk)
    last = min(order[k - 1 :], key=lambda j: (free[j] < rest, free[j], pref[j], j))  # the tightest node that holds it
    return [(j, free[j]) for j in bulk] + [(last, rest)]


def place_across(snap: ClusterSnapshot, job: JobRequest, policy: str) -> Decision:
    """All ``gpus`` of the job on as few nodes as possible (see the module docstring), or CannotPlace."""
    n = job.demand.gpus
    tried: list[str] = []
    for kind, usable, sizes in (("plain", _free_plain(snap), node_sizes(snap, mig=False)),
                                ("MIG", _empty_mig(snap), node_sizes(snap, mig=True))):
        free = np.bincount(np.asarray(snap.node_idx)[usable], minlength=sizes.size)
        picked = _pick(snap, usable, free, sizes, n)
        if picked is None:
            tried.append(f"{int(usable.size)} {kind} GPU(s) free on {int((free > 0).sum())} node(s)")
            continue
        slots = tuple(s for _, members in picked for s in _member_slots(snap.geometry, members))
        left = sum(int(free[j]) - len(members) for j, members in picked)
        reasons = (
            f"{n} GPUs across {len(picked)} node(s): " + ", ".join(f"{m[0].node}×{len(m)}" for _, m in picked),
            "the fewest nodes that hold it; whole free nodes first, the tightest node for the rest",
            f"{left} usable GPU(s) left free on the chosen nodes",
        )
        return Placement(job_id=job.job_id, policy=policy, slots=slots, tier="any", frag_before=0.0,
                         frag_after=float(left), reasons=reasons)
    return CannotPlace(job_id=job.job_id, policy=policy,
                       reasons=(f"needs {n} free GPUs across nodes; " + "; ".join(tried),))


def usable_whole(gpu: GpuView) -> bool:
    """A GPU a gang member could take now: a plain one with no job, or a MIG one with nothing busy on it."""
    return is_free_plain(gpu) if not gpu.mig else gpu.busy_mask == 0


def _free_plain(snap: ClusterSnapshot) -> npt.NDArray[np.intp]:
    healthy = np.asarray(snap.healthy, dtype=bool) & ~np.asarray(snap.mig, dtype=bool)
    return np.array([p for p in np.flatnonzero(healthy).tolist() if is_free_plain(snap.gpus[p])], dtype=np.intp)


def _empty_mig(snap: ClusterSnapshot) -> npt.NDArray[np.intp]:
    return np.flatnonzero(snap.ok & (np.asarray(snap.busy) == 0))


def _pick(
    snap: ClusterSnapshot, usable: npt.NDArray[np.intp], free: npt.NDArray[np.intp], sizes: npt.NDArray[np.intp],
    n: int,
) -> list[tuple[int, list[GpuView]]] | None:
    """Per chosen node (in rank order), its index and the GPUs the gang takes there (``free``: usable GPUs per
    node)."""
    if usable.size < n:
        return None
    node = np.asarray(snap.node_idx)[usable]
    chosen = choose_nodes(free.tolist(), (free == sizes).tolist(), n)
    if chosen is None:
        return None
    return [(j, _members(snap.geometry, [snap.gpus[p] for p in usable[node == j].tolist()], take))
            for j, take in chosen]


def _members(geometry: Geometry, gpus: Sequence[GpuView], take: int) -> list[GpuView]:
    """``take`` of a node's usable GPUs: those holding an idle full-size instance first (no reconfiguration),
    then those with the least to destroy, then by index (dedicated plain GPUs before time-sliced ones)."""

    def order(g: GpuView) -> tuple[int, int, int, int]:
        full = full_profile(geometry.model(g.model)).name
        return (0 if any(i.profile == full for i in g.instances) else 1, g.idle_mask.bit_count(), g.replicas, g.index)

    return sorted(gpus, key=order)[:take]


def member_slots(geometry: Geometry, gpus: Sequence[GpuView], take: int) -> tuple[Slot, ...]:
    """A whole-GPU member on ``take`` of ``gpus`` (one node's usable GPUs), in rank order."""
    return tuple(_member_slots(geometry, _members(geometry, gpus, take)))


def _member_slots(geometry: Geometry, gpus: Sequence[GpuView]) -> list[Slot]:
    slots: list[Slot] = []
    for g in sorted(gpus, key=lambda g: g.index):
        model = geometry.model(g.model)
        if not g.mig:
            slots.append(whole_slot(g, model))
            continue
        slots.append(full_slot(g, model))
    return slots
