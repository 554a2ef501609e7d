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
import numpy.typing as npt

from shared.mig.occupancy import span
from shared.mig.tables import COST_SCALE, popcount_table, tables_for
from shared.policy.placement.decision import JobRequest, Placement, Slot
from shared.policy.placement.gang import spans_nodes
from shared.policy.placement.sharing import SHARE_PROFILE, WHOLE_PROFILE, share_slot, whole_slot
from shared.policy.priority import PriorityClass
from shared.policy.quota import QuotaBook
from shared.policy.request import full_profile, resolve_profile
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView
from shared.policy.victim_eligibility import BLOCKED, LOST_SCALE, LOW, Eligibility, Key, Why, victim_cost


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
def _mig_options(snap: ClusterSnapshot, job: JobRequest, elig: Eligibility, counts: Counter[str]
                 ) -> tuple[Key, Slot, dict[str, InstanceView]] | None:
    """Vectorised over the GPUs of each model: one Python pass collects, per GPU, the slices held by jobs that
    may not be preempted (``blocked``) and each eligible instance's start, end, lost work and priority; then
    every legal start is scored for all GPUs at once with mask arithmetic and the FragCost table."""
    cols: list[list[npt.NDArray[np.int64]]] = [[] for _ in range(7)]
    for model_name, pos in snap.groups.items():
        model = snap.models[model_name]
        prof = resolve_profile(job.demand, model)
        if prof is None:
            counts[f"{model_name} has no profile for {job.demand.label()}"] += int(pos.size)
            continue
        ok = np.asarray(snap.mig[pos], dtype=bool) & np.asarray(snap.healthy[pos], dtype=bool)
        pos = pos[ok & (snap.busy[pos] != 0)]
        if pos.size:
            _score_starts(snap, pos, model.memory_slices, prof.memory_slices, prof.placements,
                          tables_for(model).fragcost_q, elig, counts, prof.name, cols)
    if not cols[0]:
        return None
    cnt, lost_q, pmax, psum, frag, where, neg_s = (np.concatenate(c) for c in cols)
    for i in np.lexsort((neg_s, where, frag, psum, pmax, lost_q, cnt)):
        p, s = int(where[i]), -int(neg_s[i])
        g = snap.gpus[p]
        model = snap.geometry.model(g.model)
        prof = resolve_profile(job.demand, model)
        assert prof is not None
        pm = span(prof.memory_slices, s)
        if sum(1 for x in g.instances if x.profile == prof.name and not x.mask & pm) >= prof.max_count:
            counts[f"{prof.name} at its max count"] += 1
            continue
        overlap = [x for x in g.instances if x.mask & pm]
        victims = {x.job_id: x for x in overlap if x.job_id is not None}
        if len(overlap) == 1 and overlap[0].profile == prof.name and overlap[0].start == s:
            slot = Slot(gpu_id=g.id, node=g.node, model=model.name, profile=prof.name, start=s,
                        size=prof.memory_slices, compute=prof.compute_slices, action="reuse",
                        instance_id=overlap[0].id)
        else:
            slot = Slot(gpu_id=g.id, node=g.node, model=model.name, profile=prof.name, start=s,
                        size=prof.memory_slices, compute=prof.compute_slices, action="create",
                        destroy=tuple(x.id for x in overlap))
        key: Key = (int(cnt[i]), int(lost_q[i]) / LOST_SCALE, int(pmax[i]), int(psum[i]), int(frag[i]),
                     p, -s)
        return key, slot, victims
    return None


def _score_starts(
    snap: ClusterSnapshot, pos: npt.NDArray[np.intp], slices: int, size: int, placements: tuple[int, ...],
    fragcost_q: npt.NDArray[np.int64], elig: Eligibility, counts: Counter[str], name: str,
    cols: list[list[npt.NDArray[np.int64]]],
) -> None:
    n = int(pos.size)
    blocked = [0] * n
    rows: list[int] = []
    starts_l: list[int] = []
    sizes_l: list[int] = []
    lost_l: list[float] = []
    prio_l: list[int] = []
    gpus = snap.gpus
    # the hot loop of victim selection: plain priority mode is inlined (reclaim asks ``elig.why``)
    fast, by_prio, jp, me = not elig.reclaim, elig.by_priority, elig.job.priority, elig.job.job_id
    ckpt, now = elig.checkpoints, elig.now
    for k, p in enumerate(pos.tolist()):
        g = gpus[p]
        b = 0
        for inst in g.instances:
            j = inst.job_id
            if j is None:
                continue
            if fast:
                ok = by_prio and inst.preemptible and inst.priority < jp and j != me
            else:
                ok = elig.why(g, inst) is not None
            if ok:
                rows.append(k)
                starts_l.append(inst.start)
                sizes_l.append(inst.size)
                since = max(inst.started_at, ckpt[j]) if j in ckpt else inst.started_at
                lost_l.append(now - since if now > since else 0.0)
                prio_l.append(inst.priority)
            else:
                b |= ((1 << inst.size) - 1) << inst.start
        blocked[k] = b
    has = np.zeros(n, dtype=bool)
    if not rows:
        counts[BLOCKED] += n
        return
    r = np.asarray(rows, dtype=np.intp)
    st = np.asarray(starts_l, dtype=np.int64)
    sz = np.asarray(sizes_l, dtype=np.int64)
    has[r] = True
    counts[BLOCKED] += int((~has).sum())
    starts = np.zeros(n, dtype=np.int64)
    np.bitwise_or.at(starts, r, np.left_shift(1, st))
    lost = np.zeros((n, slices), dtype=np.int64)
    lost[r, st] = np.rint(np.asarray(lost_l) * LOST_SCALE).astype(np.int64)
    pmax_t = np.full((n, slices), LOW, dtype=np.int64)
    pmax_t[r, st] = prio_l
    psum_t = np.zeros((n, slices), dtype=np.int64)
    psum_t[r, st] = prio_l
    end = np.zeros((n, slices), dtype=np.int64)
    end[r, st] = st + sz
    cover = np.full((n, slices), -1, dtype=np.int64)
    for d in range(slices):
        sel = sz > d
        cover[r[sel], st[sel] + d] = st[sel]
    blk = np.asarray(blocked, dtype=np.int64)
    busy = snap.busy[pos].astype(np.int64)
    pop = popcount_table()
    freeable = np.zeros(n, dtype=bool)
    for s in placements:
        pm = span(size, s)
        clear = (blk & pm) == 0
        freeable |= clear & has
        idx = np.flatnonzero(clear & ((busy & pm) != 0))
        if idx.size == 0:
            continue
        c = cover[idx, s]
        extra = (c >= 0) & (c < s)  # an eligible instance that starts before s and reaches into it
        cc = np.where(extra, c, 0)
        win = slice(s, s + size)
        cols[0].append(pop[starts[idx] & pm].astype(np.int64) + extra)
        cols[1].append(lost[idx, win].sum(axis=1) + np.where(extra, lost[idx, cc], 0))
        cols[2].append(np.maximum(pmax_t[idx, win].max(axis=1), np.where(extra, pmax_t[idx, cc], LOW)))
        cols[3].append(psum_t[idx, win].sum(axis=1) + np.where(extra, psum_t[idx, cc], 0))
        lo = np.where(extra, c, s)
        hi = np.maximum(s + size, end[idx, win].max(axis=1))
        gone = np.left_shift(np.left_shift(1, hi - lo) - 1, lo)
        cols[4].append(fragcost_q[(busy[idx] & ~gone) | pm])
        cols[5].append(pos[idx].astype(np.int64))
        cols[6].append(np.full(idx.size, -s, dtype=np.int64))
    stuck = int((has & ~freeable).sum())
    if stuck:
        counts[f"no {name} placement clear of protected jobs"] += stuck


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
        found = _mig_options(snap, job, elig, counts) if kind == "mig" else _share_options(snap, elig, counts)
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
