"""The MIG starts a preemption could free, scored all at once (``shared.policy.preemption``'s MIG case).

Vectorised over the GPUs of each model: one Python pass collects, per GPU, the slices held by jobs that may not
be preempted (``blocked``) and each eligible instance's start, end, lost work and priority; then every legal
start is scored for all GPUs at once with mask arithmetic and the FragCost table."""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from shared.mig.occupancy import span
from shared.mig.tables import popcount_table, tables_for
from shared.policy.placement.decision import JobRequest, Slot
from shared.policy.request import resolve_profile
from shared.policy.snapshot import ClusterSnapshot, InstanceView
from shared.policy.victim_eligibility import BLOCKED, LOST_SCALE, LOW, Eligibility, Key

Columns = list[list[npt.NDArray[np.int64]]]
"""Per start examined, its key's fields (victims, lost work, highest and summed priority, FragCost after, GPU
position, minus the start), one array per GPU group."""


def mig_options(snap: ClusterSnapshot, job: JobRequest, elig: Eligibility, counts: Counter[str]
                ) -> tuple[Key, Slot, dict[str, InstanceView]] | None:
    """The cheapest start to free for a MIG request (its key, slot and victims by job), or None; ``counts``
    gathers why GPUs could not serve."""
    cols: Columns = [[] for _ in range(7)]
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


class _Eligible(NamedTuple):
    """Per GPU (by row), the slices of the jobs that may not be preempted; per eligible instance, its GPU's row,
    start, size, lost work (seconds) and priority."""

    blocked: list[int]
    rows: list[int]
    starts: list[int]
    sizes: list[int]
    lost: list[float]
    prio: list[int]


def _eligible(snap: ClusterSnapshot, pos: npt.NDArray[np.intp], elig: Eligibility) -> _Eligible:
    out = _Eligible([0] * int(pos.size), [], [], [], [], [])
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
                out.rows.append(k)
                out.starts.append(inst.start)
                out.sizes.append(inst.size)
                since = max(inst.started_at, ckpt[j]) if j in ckpt else inst.started_at
                out.lost.append(now - since if now > since else 0.0)
                out.prio.append(inst.priority)
            else:
                b |= ((1 << inst.size) - 1) << inst.start
        out.blocked[k] = b
    return out


class _Tables(NamedTuple):
    """Per GPU row and slice: the eligible instance starting there (``starts``, a bitmask per row), its lost
    work, priority (as a max and as a sum), end slice, and which eligible instance covers each slice."""

    starts: npt.NDArray[np.int64]
    lost: npt.NDArray[np.int64]
    pmax: npt.NDArray[np.int64]
    psum: npt.NDArray[np.int64]
    end: npt.NDArray[np.int64]
    cover: npt.NDArray[np.int64]


def _tables(e: _Eligible, n: int, slices: int) -> _Tables:
    r = np.asarray(e.rows, dtype=np.intp)
    st = np.asarray(e.starts, dtype=np.int64)
    sz = np.asarray(e.sizes, dtype=np.int64)
    starts = np.zeros(n, dtype=np.int64)
    np.bitwise_or.at(starts, r, np.left_shift(1, st))
    lost = np.zeros((n, slices), dtype=np.int64)
    lost[r, st] = np.rint(np.asarray(e.lost) * LOST_SCALE).astype(np.int64)
    pmax = np.full((n, slices), LOW, dtype=np.int64)
    pmax[r, st] = e.prio
    psum = np.zeros((n, slices), dtype=np.int64)
    psum[r, st] = e.prio
    end = np.zeros((n, slices), dtype=np.int64)
    end[r, st] = st + sz
    cover = np.full((n, slices), -1, dtype=np.int64)
    for d in range(slices):
        sel = sz > d
        cover[r[sel], st[sel] + d] = st[sel]
    return _Tables(starts, lost, pmax, psum, end, cover)


def _score_starts(
    snap: ClusterSnapshot, pos: npt.NDArray[np.intp], slices: int, size: int, placements: tuple[int, ...],
    fragcost_q: npt.NDArray[np.int64], elig: Eligibility, counts: Counter[str], name: str, cols: Columns,
) -> None:
    """Append to ``cols`` the key fields of every start of ``placements`` (a profile of ``size`` slices) on the
    GPUs ``pos`` whose slices no protected job holds."""
    n = int(pos.size)
    e = _eligible(snap, pos, elig)
    if not e.rows:
        counts[BLOCKED] += n
        return
    has = np.zeros(n, dtype=bool)
    has[np.asarray(e.rows, dtype=np.intp)] = True
    counts[BLOCKED] += int((~has).sum())
    t = _tables(e, n, slices)
    blk = np.asarray(e.blocked, dtype=np.int64)
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
        c = t.cover[idx, s]
        extra = (c >= 0) & (c < s)  # an eligible instance that starts before s and reaches into it
        cc = np.where(extra, c, 0)
        win = slice(s, s + size)
        cols[0].append(pop[t.starts[idx] & pm].astype(np.int64) + extra)
        cols[1].append(t.lost[idx, win].sum(axis=1) + np.where(extra, t.lost[idx, cc], 0))
        cols[2].append(np.maximum(t.pmax[idx, win].max(axis=1), np.where(extra, t.pmax[idx, cc], LOW)))
        cols[3].append(t.psum[idx, win].sum(axis=1) + np.where(extra, t.psum[idx, cc], 0))
        lo = np.where(extra, c, s)
        hi = np.maximum(s + size, t.end[idx, win].max(axis=1))
        gone = np.left_shift(np.left_shift(1, hi - lo) - 1, lo)
        cols[4].append(fragcost_q[(busy[idx] & ~gone) | pm])
        cols[5].append(pos[idx].astype(np.int64))
        cols[6].append(np.full(idx.size, -s, dtype=np.int64))
    stuck = int((has & ~freeable).sum())
    if stuck:
        counts[f"no {name} placement clear of protected jobs"] += stuck
