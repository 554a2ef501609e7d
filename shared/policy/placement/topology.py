"""Gangs within one topology domain: the nodes that share a ``block`` or ``rack`` label.

A gang with a topology preference or requirement is placed in each domain alone (every other node's GPUs look
unusable to the policy), and the best of those placements wins: the fewest nodes, then the domain with the fewest
free GPUs that still holds it (the tightest fit, as Kueue's topology-aware scheduling does). A requirement waits
when no domain holds the gang now; a preference then places it across domains by the policy's own rule. A node
without the label is in no domain.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import msgspec
import numpy as np

from shared.policy.placement.decision import CannotPlace, Decision, JobRequest, Placement
from shared.policy.placement.gang import usable_whole
from shared.policy.snapshot import ClusterSnapshot


def domains(labels: Mapping[str, Mapping[str, str]], level: str, nodes: Collection[str]) -> dict[str, set[str]]:
    """Domain (the ``level`` label's value) -> its nodes, among ``nodes``."""
    out: dict[str, set[str]] = {}
    for node in nodes:
        value = labels.get(node, {}).get(level)
        if value:
            out.setdefault(value, set()).add(node)
    return out


def never_within(gpus: int, level: str, sizes: Mapping[str, int]) -> str | None:
    """Why a gang that requires one ``level`` domain can never run: it needs more GPUs than every domain has
    (``sizes``: each domain's GPUs); None when some domain could hold it."""
    largest = max(sizes.values(), default=0)
    if gpus <= largest:
        return None
    if not sizes:
        return f"needs {gpus} GPUs within one {level}; no node has a {level} label"
    return f"needs {gpus} GPUs within one {level}; the largest {level} has {largest}"


def place_within(
    job_id: str,
    level: str,
    required: bool,
    doms: Mapping[str, set[str]],
    free: Mapping[str, int],
    place: Callable[[set[str] | None], Decision],
) -> Decision:
    """The gang in one domain (``place(nodes)``: the policy's decision on those nodes only; ``place(None)``: on
    every node), chosen by the module's rule; ``free``: the usable GPUs of each domain now."""
    best: tuple[tuple[int, int, str], Placement] | None = None
    for name, nodes in doms.items():
        dec = place(nodes)
        if isinstance(dec, Placement):
            key = (len({s.node for s in dec.slots}), free.get(name, 0), name)
            if best is None or key < best[0]:
                best = (key, dec)
    if best is not None:
        key, dec = best
        why = f"within {level} {key[2]} ({key[0]} node(s); {key[1]} free GPU(s) there before)"
        return msgspec.structs.replace(dec, reasons=(why, *dec.reasons))
    if not required:
        return place(None)
    what = f"{len(doms)} {level}(s)" if doms else f"no node with a {level} label"
    return CannotPlace(job_id=job_id, policy="topology",
                       reasons=(f"no {level} holds the gang now ({what}; topology: {level} required)",))


def only(snap: ClusterSnapshot, nodes: Collection[str]) -> ClusterSnapshot:
    """The snapshot with the GPUs of every node outside ``nodes`` unusable."""
    inside = np.fromiter((g.node in nodes for g in snap.gpus), dtype=bool, count=len(snap.gpus))
    return snap.with_columns(healthy=np.asarray(snap.healthy, dtype=bool) & inside)


def within_domains(snap: ClusterSnapshot, job: JobRequest, policy: Callable[[ClusterSnapshot, JobRequest], Decision],
                   ) -> Decision:
    """``place_within`` on a snapshot: each of ``job.domains`` alone is the snapshot with every other node's GPUs
    unusable, decided by ``policy`` (the simulator and the balancer alike: the registry's wrapper, or the mirror
    for the seeds' balancer)."""
    doms = {name: set(nodes) for name, nodes in job.domains}
    healthy = np.asarray(snap.healthy, dtype=bool)
    free: dict[str, int] = {}
    for p, g in enumerate(snap.gpus):
        if healthy[p] and usable_whole(g):
            for name, nodes in doms.items():
                if g.node in nodes:
                    free[name] = free.get(name, 0) + 1
    plain = msgspec.structs.replace(job, domains=())

    def place(nodes: set[str] | None) -> Decision:
        return policy(snap, plain) if nodes is None else policy(only(snap, nodes), plain)

    return place_within(job.job_id, job.domain_level or "domain", job.domain_required, doms, free, place)
