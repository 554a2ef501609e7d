"""Victim selection: the cheapest set of running jobs whose removal frees a legal placement for a waiting job.

Who may be a victim (an instance's job, all of its instances for a gang):

- never a job whose class is not preemptible (``InstanceView.preemptible == False``);
- **priority mode**: a job of strictly lower priority, when the preemptor's class is ``PreemptLowerPriority``;
- **reclaim mode** (Kueue's ``reclaimWithinCohort``): when the preemptor's request fits its own nominal quota,
  a job of *another* tenant of its cohort that is borrowing a resource the job is charged in (its usage of
  that resource is above its nominal) — of any priority when the cohort's ``reclaim = "Any"`` (default), only
  lower priority with ``"LowerPriority"``, none with ``"Never"``. Reclaim applies even for a ``Never`` class:
  taking back lent quota is not priority preemption. A borrower's jobs are exactly its reclaimable capacity.

What is freed: a MIG request needs one legal placement (profile per GPU model, start, max count) on one MIG
GPU; a share needs one replica of a time-sliced plain GPU; ``gpus: n`` needs n GPUs of one kind (plain, or MIG
taken whole) on one node, or, for a gang bigger than every node, the n cheapest to free on any nodes. Only GPUs
where the eligible busy instances cover what blocks a placement are examined: per GPU, the busy instances that
may not be preempted form a ``blocked`` mask, and a start is a candidate only when its slices miss that mask —
one mask test per legal start.

Cost, lowest first: fewest victim jobs; least lost work (seconds since each victim started or last
checkpointed, summed, with ``now`` and checkpoints handed in); lowest highest-victim priority, then lowest
priority sum; lowest FragCost after (MIG); then the GPU/node listed first and the higher start. Every victim
carries its why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import msgspec
import numpy as np

from shared.mig.tables import COST_SCALE, tables_for
from shared.policy.placement.decision import JobRequest, Placement, Slot
from shared.policy.placement.gang import spans_nodes
from shared.policy.placement.sharing import SHARE_PROFILE, WHOLE_PROFILE, share_slot, whole_slot
from shared.policy.priority import PriorityClass
from shared.policy.quota import QuotaBook
from shared.policy.request import full_profile
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView
from shared.policy.victim_eligibility import BLOCKED, Eligibility, Key, Why, victim_cost
from shared.policy.victim_starts import mig_options


class Victim(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    tenant: str
    priority: int
    why: Why
    detail: str
    lost_work_s: float
    gpu_ids: tuple[str, ...]
    instance_ids: tuple[str, ...]


class Victims(msgspec.Struct, frozen=True, kw_only=True):
    """Preempt these jobs, then ``placement`` is legal. Commit both atomically; re-queue the victims."""

    job_id: str
    victims: tuple[Victim, ...]
    placement: Placement
    lost_work_s: float
    reasons: tuple[str, ...]

    def explain(self) -> str:
        names = ", ".join(f"{v.job_id} ({v.detail}, loses {v.lost_work_s:g}s)" for v in self.victims)
        return f"{self.job_id} preempts {names}; then " + self.placement.explain()


class NoVictims(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    reasons: tuple[str, ...]
    counts: dict[str, int] = {}


Choice = Victims | NoVictims
def _share_options(snap: ClusterSnapshot, elig: Eligibility, counts: Counter[str]
                   ) -> tuple[Key, Slot, dict[str, InstanceView]] | None:
    best: tuple[Key, Slot, dict[str, InstanceView]] | None = None
    plain = np.flatnonzero(~np.asarray(snap.mig, dtype=bool) & np.asarray(snap.healthy, dtype=bool))
    for p in plain.tolist():
        g = snap.gpus[p]
        if g.replicas < 1:
            continue
        busy = [i for i in g.instances if i.busy]
        whole = [i for i in busy if i.profile == WHOLE_PROFILE]
        shares = [i for i in busy if i.profile == SHARE_PROFILE]
        if whole:
            options = [(whole[0], 0)] if elig.why(g, whole[0]) is not None else []
        elif len(shares) >= g.replicas:
            options = [(i, i.start) for i in shares if elig.why(g, i) is not None]
        else:
            continue  # a replica is free: no preemption needed
        if not options:
            counts[BLOCKED] += 1
        for inst, replica in options:
            victims = {inst.job_id or "": inst}
            key: Key = (*victim_cost(victims, elig), 0, p, -replica)
            if best is None or key < best[0]:
                best = (key, share_slot(g, snap.geometry.model(g.model), replica), victims)
    return best


def _whole_slot(snap: ClusterSnapshot, g: GpuView) -> Slot:
    model = snap.geometry.model(g.model)
    if not g.mig:
        return whole_slot(g, model)
    full = full_profile(model)
    present = next((i for i in g.instances if i.profile == full.name and i.start == full.placements[0]), None)
    if present is not None and len(g.instances) == 1:
        return Slot(gpu_id=g.id, node=g.node, model=model.name, profile=full.name, start=present.start,
                    size=full.memory_slices, compute=full.compute_slices, action="reuse",
                    instance_id=present.id)
    return Slot(gpu_id=g.id, node=g.node, model=model.name, profile=full.name, start=full.placements[0],
                size=full.memory_slices, compute=full.compute_slices, action="create",
                destroy=tuple(i.id for i in g.instances))


_Cand = tuple[tuple[int, float, int], GpuView, dict[str, InstanceView]]
"""A GPU a gang could take once its victims go: (victims, lost work, index), the GPU, its victims by job."""


def _gang_options(snap: ClusterSnapshot, job: JobRequest, elig: Eligibility, counts: Counter[str]
                  ) -> tuple[Key, tuple[Slot, ...], dict[str, InstanceView]] | None:
    n = job.demand.gpus
    groups: dict[tuple[str, bool], list[_Cand]] = {}
    order: dict[str, int] = {}
    for p, g in enumerate(snap.gpus):
        if not snap.healthy[p]:
            continue
        order.setdefault(g.node, p)
        victims: dict[str, InstanceView] = {}
        ok = True
        for inst in g.instances:
            if inst.busy:
                if elig.why(g, inst) is None:
                    ok = False
                    break
                victims[inst.job_id or ""] = inst
        if not ok:
            continue
        c = victim_cost(victims, elig)
        groups.setdefault((g.node, g.mig), []).append(((c[0], c[1], g.index), g, victims))
    best: tuple[Key, tuple[Slot, ...], dict[str, InstanceView]] | None = None
    if spans_nodes(snap, job.demand):
        return _across(snap, groups, order, n, elig, counts)
    for (node, mig), cands in groups.items():
        if len(cands) < n:
            continue
        cands.sort(key=lambda c: c[0])
        chosen = cands[:n]
        victims = {j: i for _, _, vs in chosen for j, i in vs.items()}
        if not victims:
            continue  # n GPUs are free already
        key: Key = (*victim_cost(victims, elig), int(mig), order[node], 0)
        if best is None or key < best[0]:
            best = (key, tuple(_whole_slot(snap, g) for _, g, _ in chosen), victims)
    if best is None:
        counts[f"no node has {n} GPU(s) of one kind freeable"] = 1
    return best


def _across(snap: ClusterSnapshot, groups: Mapping[tuple[str, bool], list[_Cand]], order: Mapping[str, int], n: int,
            elig: Eligibility, counts: Counter[str]) -> tuple[Key, tuple[Slot, ...], dict[str, InstanceView]] | None:
    """A gang bigger than every node: the ``n`` GPUs of one kind that are cheapest to free, on any nodes (free
    GPUs first, then by victims and lost work, then the node listed first), members in rank order."""
    best: tuple[Key, tuple[Slot, ...], dict[str, InstanceView]] | None = None
    for mig in (False, True):
        cands = [(c, g, vs) for (node, m), cs in groups.items() if m == mig for c, g, vs in cs]
        if len(cands) < n:
            continue
        cands.sort(key=lambda c: (c[0][0], c[0][1], order[c[1].node], c[1].index))
        chosen = sorted(cands[:n], key=lambda c: (order[c[1].node], c[1].index))
        victims = {j: i for _, _, vs in chosen for j, i in vs.items()}
        if not victims:
            continue
        key: Key = (*victim_cost(victims, elig), int(mig), order[chosen[0][1].node], 0)
        if best is None or key < best[0]:
            best = (key, tuple(_whole_slot(snap, g) for _, g, _ in chosen), victims)
    if best is None:
        counts[f"fewer than {n} GPU(s) of one kind freeable in the cluster"] = 1
    return best


def choose_victims(
    snap: ClusterSnapshot,
    job: JobRequest,
    now: float,
    *,
    klass: PriorityClass | None = None,
    book: QuotaBook | None = None,
    checkpoints: Mapping[str, float] | None = None,
    policy: str = "preemption",
) -> Choice:
    """The cheapest victims whose removal lets ``job`` be placed, with that placement; or why there are none.

    Call it after ``place`` returned CannotPlace. ``klass`` is the job's priority class (None: may preempt
    lower priority); ``book`` enables cohort reclaim; ``checkpoints`` maps job id -> its last checkpoint time.
    """
    elig = Eligibility(snap, job, klass, book, now, checkpoints or {})
    if not elig.anything:
        why = f"priority class {klass.name!r} never preempts" if klass is not None else "preemption disabled"
        return NoVictims(job_id=job.job_id, reasons=(why + " and there is nothing to reclaim",))
    counts: Counter[str] = Counter()
    kind = job.demand.kind
    best: tuple[Key, tuple[Slot, ...], dict[str, InstanceView]] | None
    if kind == "gpus":
        best = _gang_options(snap, job, elig, counts)
    else:
        found = mig_options(snap, job, elig, counts) if kind == "mig" else _share_options(snap, elig, counts)
        best = None if found is None else (found[0], (found[1],), found[2])
    if best is None:
        reasons = tuple(f"{n} GPU(s): {why}" for why, n in counts.most_common())
        return NoVictims(job_id=job.job_id, counts=dict(counts),
                         reasons=("no set of preemptible jobs frees a legal placement", *reasons))
    key, slots, chosen = best
    spots = _where(snap, set(chosen))
    victims = []
    for job_id, inst in sorted(chosen.items(), key=lambda kv: (kv[1].priority, kv[0])):
        gpu = snap.gpus[snap.position[spots[job_id][0][0]]]
        because = elig.why(gpu, inst)
        assert because is not None
        victims.append(Victim(
            job_id=job_id, tenant=inst.tenant, priority=inst.priority, why=because[0], detail=because[1],
            lost_work_s=elig.lost(inst), gpu_ids=tuple(dict.fromkeys(g for g, _ in spots[job_id])),
            instance_ids=tuple(i for _, i in spots[job_id]),
        ))
    where = ", ".join(f"{s.gpu_id} {s.profile}@{s.start}" for s in slots)
    reasons = (f"preempts {key[0]} job(s), losing {key[1]:g}s of work, highest victim priority {key[2]}",
               f"frees {where}")
    before = after = 0.0
    if kind == "mig":
        g0 = snap.gpu(slots[0].gpu_id)
        before, after = tables_for(snap.geometry.model(g0.model)).cost(g0.busy_mask), key[4] / COST_SCALE
    placement = Placement(job_id=job.job_id, policy=policy, slots=slots, tier="any", frag_before=before,
                          frag_after=after, reasons=reasons)
    return Victims(job_id=job.job_id, victims=tuple(victims), placement=placement, lost_work_s=key[1],
                   reasons=reasons)


def _where(snap: ClusterSnapshot, job_ids: set[str]) -> dict[str, list[tuple[str, str]]]:
    """Every (gpu id, instance id) of the given jobs: a gang victim is stopped on all its GPUs, on every node
    it spans."""
    out: dict[str, list[tuple[str, str]]] = {}
    for g in snap.gpus:
        for inst in g.instances:
            if inst.job_id in job_ids:
                out.setdefault(inst.job_id, []).append((g.id, inst.id))
    return out
