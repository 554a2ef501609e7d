"""GPUs that are not in MIG mode: whole-GPU jobs and time-sliced shares. The sharing mode is per GPU.

Representation (the state store, the executor and the simulator all follow it):

- A GPU with ``GpuView.mig == False`` is a plain GPU. ``replicas == 0``: it takes whole-GPU jobs only.
  ``replicas == N >= 1``: it is time-sliced into N shares, and also takes a whole-GPU job while no share is in
  use. (``replicas`` on a MIG GPU is ignored: MIG instances are not time-sliced here.)
- A whole-GPU job on a plain GPU is one busy ``InstanceView`` with ``profile == "gpu"``, ``start = 0``, ``size
  = model.memory_slices`` and ``compute = model.compute_slices``: the GPU's busy mask is full, its load 1.
- A used share is one busy ``InstanceView`` with ``profile == "shared"``, ``start`` = the replica index
  (0..N-1, what the executor exports as the replica id), ``size = 0`` and ``compute = 0``: shares leave the
  busy mask at 0 because nothing is partitioned; count them with ``shares_used``. There are no idle instances
  on plain GPUs: a finished whole-GPU job or share simply disappears.
- A share has **no memory isolation**: every share sees the whole GPU memory and an out-of-memory neighbour
  can fail the others; ``replicas`` bounds how many jobs share the time slices, not how much memory each gets.

Mixed clusters: MIG requests go to MIG GPUs only (``place_mig`` filters on ``snap.mig``); shares go to plain
GPUs with ``replicas >= 1`` only; a ``gpus: n`` job takes n plain GPUs with no job on one node, or falls back
to n entirely free MIG GPUs on one node (``balancer.place_whole``); a gang never mixes the two kinds.
"""

from __future__ import annotations

from collections import Counter

import msgspec
import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel
from shared.policy.placement.decision import CannotPlace, Decision, JobRequest, Placement, Slot
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView

WHOLE_PROFILE = "gpu"
SHARE_PROFILE = "shared"


def shares_used(gpu: GpuView) -> int:
    return sum(1 for i in gpu.instances if i.busy and i.profile == SHARE_PROFILE)


def has_whole_job(gpu: GpuView) -> bool:
    return any(i.busy and i.profile == WHOLE_PROFILE for i in gpu.instances)


def is_free_plain(gpu: GpuView) -> bool:
    """A plain GPU with no job at all (neither whole nor share)."""
    return not gpu.mig and not any(i.busy for i in gpu.instances)


def free_replica(gpu: GpuView) -> int | None:
    """The lowest free replica of a time-sliced GPU, or None (all used, a whole-GPU job on it, not shared)."""
    if gpu.mig or gpu.replicas < 1 or has_whole_job(gpu):
        return None
    taken = {i.start for i in gpu.instances if i.busy and i.profile == SHARE_PROFILE}
    for r in range(gpu.replicas):
        if r not in taken:
            return r
    return None


def whole_instance(model: GpuModel, job: JobRequest, instance_id: str, now: float,
                   preemptible: bool = True) -> InstanceView:
    """The instance that records a whole-GPU job on a plain GPU."""
    return InstanceView(
        id=instance_id, profile=WHOLE_PROFILE, start=0, size=model.memory_slices,
        compute=model.compute_slices, job_id=job.job_id, migratable=False,
        latency_sensitive=job.latency_sensitive, priority=job.priority, tenant=job.tenant, started_at=now,
        preemptible=preemptible,
    )


def share_instance(replica: int, job: JobRequest, instance_id: str, now: float,
                   preemptible: bool = True) -> InstanceView:
    """The instance that records one used share (replica ``replica``) of a time-sliced GPU."""
    return InstanceView(
        id=instance_id, profile=SHARE_PROFILE, start=replica, size=0, compute=0, job_id=job.job_id,
        migratable=False, latency_sensitive=job.latency_sensitive, priority=job.priority, tenant=job.tenant,
        started_at=now, preemptible=preemptible,
    )


def instance_for_slot(slot: Slot, template: InstanceView, instance_id: str) -> InstanceView:
    """The busy instance a plain slot (``gpu`` or ``shared``) becomes: ``template`` carries the job's fields
    (job id, tenant, priority, started_at, preemptible), the slot gives profile, start, size and compute. No
    partitioning happens on a plain GPU, so the state store and the simulator add it as is."""
    return msgspec.structs.replace(template, id=instance_id, profile=slot.profile, start=slot.start,
                                   size=slot.size, compute=slot.compute)


def whole_slot(gpu: GpuView, model: GpuModel) -> Slot:
    return Slot(gpu_id=gpu.id, node=gpu.node, model=model.name, profile=WHOLE_PROFILE, start=0,
                size=model.memory_slices, compute=model.compute_slices, action="create")


def share_slot(gpu: GpuView, model: GpuModel, replica: int) -> Slot:
    return Slot(gpu_id=gpu.id, node=gpu.node, model=model.name, profile=SHARE_PROFILE, start=replica,
                size=0, compute=0, action="create")


def _plain_positions(snap: ClusterSnapshot) -> npt.NDArray[np.intp]:
    """Healthy plain GPUs (the healthy column, so that a held-back snapshot hides reserved GPUs)."""
    return np.flatnonzero(~np.asarray(snap.mig, dtype=bool) & np.asarray(snap.healthy, dtype=bool))


def no_node_has(n: int, what: str, most: int, mig: bool = False) -> str:
    """Why a gang of ``n`` whole GPUs (``what`` ones, in MIG mode or not) finds no node with room for it."""
    return f"no node has {n} {what} GPU(s){' in MIG mode' if mig else ''}; the most on one node is {most}"


def gang_reasons(snap: ClusterSnapshot, plain: CannotPlace, mig: CannotPlace) -> CannotPlace:
    """Why a ``gpus: n`` job fits neither on plain GPUs (``plain``) nor on GPUs in MIG mode (``mig``): both
    answers, less the one about a kind the cluster has no GPU of (it would only say that no node has room), unless
    the MIG rule keeps the job waiting (``deferred``: its reason is why)."""
    kinds = np.asarray(snap.mig, dtype=bool)
    keep_mig = kinds.any() or mig.deferred or not len(snap)
    reasons = (plain.reasons if (~kinds).any() else ()) + (mig.reasons if keep_mig else ())
    return msgspec.structs.replace(mig, reasons=reasons, counts={**plain.counts, **mig.counts})


def place_plain_gpus(
    snap: ClusterSnapshot, job: JobRequest, policy: str = "balancer", whole_on_shared: bool = True
) -> Decision:
    """``gpus: n`` on n plain GPUs with no job, all on one node, all or nothing.

    Node: the one with the fewest free plain GPUs that still has n (best fit keeps whole nodes free for bigger
    gangs), ties to the node listed first. On it: dedicated GPUs (``replicas == 0``) before time-sliced ones
    (keep share capacity), then lower index. ``whole_on_shared=False`` keeps time-sliced GPUs for shares only.
    """
    n = job.demand.gpus
    by_node: dict[str, list[GpuView]] = {}
    counts: Counter[str] = Counter()
    for p in _plain_positions(snap):
        g = snap.gpus[p]
        if not is_free_plain(g):
            counts["plain GPU in use"] += 1
        elif g.replicas >= 1 and not whole_on_shared:
            counts["time-sliced GPU kept for shares"] += 1
        else:
            by_node.setdefault(g.node, []).append(g)
    fitting = [(len(gs), i, node) for i, (node, gs) in enumerate(by_node.items()) if len(gs) >= n]
    if not fitting:
        most = max((len(v) for v in by_node.values()), default=0)
        reasons = (no_node_has(n, "free plain (non-MIG)", most),)
        return CannotPlace(job_id=job.job_id, policy=policy, reasons=reasons, counts=dict(counts))
    free_on_node, _, node = min(fitting)
    chosen = sorted(by_node[node], key=lambda g: (g.replicas >= 1, g.index))[:n]
    slots = tuple(whole_slot(g, snap.geometry.model(g.model)) for g in chosen)
    chosen_reasons = (
        f"{n} whole plain GPU(s) on node {node}, the tightest node that fits ({free_on_node} free there)",
        "dedicated GPUs before time-sliced ones",
    )
    return Placement(job_id=job.job_id, policy=policy, slots=slots, tier="any", frag_before=0.0,
                     frag_after=0.0, reasons=chosen_reasons)


def place_share(snap: ClusterSnapshot, job: JobRequest, policy: str = "balancer") -> Decision:
    """One time-sliced share: the GPU with the most shares already used that still has a replica free (packs
    shares, keeps whole GPUs free), ties to the lower GPU index, then the GPU listed first.

    Vectorised on the representation: a plain GPU holds only busy instances (shares, or one whole-GPU job that
    fills its busy mask), so its instance count is its shares in use; the chosen GPU is checked exactly."""
    plain = _plain_positions(snap)
    gpus = snap.gpus
    n = int(plain.size)
    reps = np.fromiter((gpus[p].replicas for p in plain), dtype=np.int64, count=n)
    used = np.fromiter((len(gpus[p].instances) for p in plain), dtype=np.int64, count=n)
    index = np.fromiter((gpus[p].index for p in plain), dtype=np.int64, count=n)
    whole = snap.busy[plain] != 0
    shared = reps >= 1
    ok = shared & ~whole & (used < reps)
    ranked = np.lexsort((plain, index, -used))  # most shares used, then lower index, then listed first
    for i in ranked[ok[ranked]]:
        g = gpus[plain[i]]
        r = free_replica(g)
        if r is None:
            continue
        slot = share_slot(g, snap.geometry.model(g.model), r)
        reasons = (
            f"packs shares: {g.id} has {shares_used(g)}/{g.replicas} replicas in use, takes replica {r}",
            "no memory isolation: the share sees the whole GPU memory",
        )
        return Placement(job_id=job.job_id, policy=policy, slots=(slot,), tier="any", frag_before=0.0,
                         frag_after=0.0, reasons=reasons)
    counts: Counter[str] = Counter()
    if (~shared).any():
        counts["not time-sliced (replicas 0)"] = int((~shared).sum())
    if (shared & ~ok).any():
        counts["whole-GPU job or all replicas in use"] = int((shared & ~ok).sum())
    mig = int(np.asarray(snap.mig, dtype=bool).sum())
    if mig:
        counts["MIG GPU (shares need a non-MIG GPU)"] = mig
    detail = tuple(f"{c} GPU(s): {why}" for why, c in counts.most_common()) or ("no GPU in the cluster",)
    return CannotPlace(job_id=job.job_id, policy=policy,
                       reasons=("no time-sliced GPU has a free replica", *detail), counts=dict(counts))
