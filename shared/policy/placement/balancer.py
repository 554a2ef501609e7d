"""The conditional load balancer (the seeds' algorithm), vectorised over the snapshot's columns.

Order of preference for a MIG request, over every GPU that is healthy, in MIG mode and has a fitting profile:

1. tier: Lazy GPUs (load < threshold) before Busy ones; a Busy GPU is used only when no Lazy GPU fits;
2. action: reuse an idle instance of the exact profile before creating one;
3. lowest FragCost after the placement (busy instances only: idle ones are reclaimable);
4. fewest idle memory slices destroyed (each destroyed instance is a reconfiguration);
5. lower load, then the higher start index (NVIDIA's habit, keeps low slices for big profiles);
6. the GPU listed first in the snapshot.

All six keys are packed into one int64 per GPU so that the choice is one argmin. Everything but tier and load is
precomputed per GPU model and request (``balancer_keys.py``) as a table indexed by ``busy << 8 | idle`` (create)
or ``busy << 8 | starts of idle instances of the profile`` (reuse); the tables of a snapshot's models are
stacked so that one decision is a few gathers over the snapshot's columns, whatever the model mix
(``load/bench_placement.py``; ``tests/reference_balancer.py`` is the same algorithm as a plain loop). The
``Placement`` of a chosen candidate is built in ``explain.py``; ``index.py`` gives the same decisions
incrementally, for the simulator and the balancer service's mirror.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import msgspec
import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel, Profile
from shared.policy.placement.balancer_keys import _UNFIT, _compile, _Compiled, _tier_load
from shared.policy.placement.decision import CannotPlace, Decision, JobRequest, Placement
from shared.policy.placement.explain import Cand, explain_choice, whole_placement
from shared.policy.placement.explain import idle_at as _idle_at
from shared.policy.placement.sharing import gang_reasons, no_node_has, place_plain_gpus, place_share
from shared.policy.placement.slots import create_slot as _create_slot
from shared.policy.placement.slots import full_slot, whole_order
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView

__all__ = ["BalancerParams", "_create_slot", "_idle_at", "pack_key", "place", "place_mig", "place_whole"]

_NONE = np.iinfo(np.int64).max


class BalancerParams(msgspec.Struct, frozen=True, kw_only=True):
    threshold: float = 0.4
    lazy_first: bool = True
    dynamic: bool = True
    """Create instances on demand. False = static partitions: only existing idle instances are used."""
    allow_larger: bool = False
    """Reuse an idle instance of a larger profile (internal fragmentation); static layouts need it."""
    top_k: int = 3
    rank: str = "absolute"
    """Key 3 across GPUs: ``absolute`` = FragCost after the placement (the seeds' rule, which spreads small
    jobs onto empty GPUs: empty + 1g scores 0.315, a GPU holding a 1g scores 0.437 after a second one);
    ``delta`` = its increase, after - before, which packs them and keeps whole GPUs free (see
    docs/simulator.md). Within one GPU both orders pick the same start."""


def pack_key(
    tier: npt.NDArray[np.int64] | int,
    action: int,
    cost_q: npt.NDArray[np.int64] | int,
    waste: npt.NDArray[np.int64] | int,
    overlap: npt.NDArray[np.int64] | int,
    load_q: npt.NDArray[np.int64] | int,
    start: npt.NDArray[np.int64] | int,
) -> npt.NDArray[np.int64]:
    """One comparable integer per candidate: lower is better (see the module docstring)."""
    k = np.asarray(tier, dtype=np.int64) * 2 + action
    k = (k << 31) + cost_q
    k = (k << 3) + waste
    k = (k << 4) + overlap
    k = (k << 11) + load_q
    return (k << 4) + (15 - np.asarray(start, dtype=np.int64))


def _count_ok(gpu: GpuView, prof: Profile, start: int) -> bool:
    """Room for one more ``prof`` at ``start`` once the idle instances in the way are destroyed (the
    registry's rule)."""
    pm = ((1 << prof.memory_slices) - 1) << start
    n = sum(1 for i in gpu.instances if i.profile == prof.name and (i.busy or not i.mask & pm))
    return n < prof.max_count


def place_mig(
    snap: ClusterSnapshot, job: JobRequest, params: BalancerParams, policy: str = "balancer"
) -> Decision:
    """The best MIG placement, vectorised over every GPU at once with the stacked per-model tables."""
    n = len(snap)
    if n == 0:
        return CannotPlace(job_id=job.job_id, policy=policy, reasons=("no GPU in the cluster",))
    comp = _compile(snap.model_list, job.demand, params.dynamic, params.allow_larger, params.rank == "delta")
    mi: npt.NDArray[np.intp] = snap.model_idx  # type: ignore[assignment]  # uint8: indexes the same
    ok = snap.ok
    all_ok = bool(ok.all())
    tl = _tier_load(snap.model_list, params.threshold, params.lazy_first)[snap.load_idx]
    # reuse: only GPUs holding an idle instance the job can take (usually a minority) are looked up
    rpos = np.zeros(0, dtype=np.intp)
    rkeys = np.zeros(0, dtype=np.int64)
    if comp.reuse:
        # one model: the bits are a scalar, not a gather per GPU
        bits = comp.idle_bits[0] if len(snap.model_list) == 1 else comp.idle_bits[mi]
        idle_profiles: npt.NDArray[np.uint32] = np.asarray(snap.idle_profiles)
        holds = (idle_profiles & bits) != 0
        rpos = np.flatnonzero(holds if all_ok else ok & holds)
        if rpos.size:
            rkeys = np.full(rpos.size, _UNFIT, dtype=np.int64)
            mi_r = mi[rpos].astype(np.intp)
            base_r = snap.pair[rpos] & ~0xFF
            starts_all = snap.idle_starts
            for table, pidx in comp.reuse:
                rkeys = np.minimum(rkeys, table[base_r | starts_all[rpos, pidx[mi_r]]])
            rkeys += tl[rpos]
    ckeys = None
    if comp.create is not None:
        ckeys = comp.create[snap.pair]
        ckeys += tl
        if not all_ok:
            ckeys[~ok] = _UNFIT
    cands = _shortlist(snap.model_list, comp, mi, rpos, rkeys, ckeys, params.top_k)
    counts: Counter[str] = Counter()
    chosen = _first_legal(snap.gpus, cands[:1], counts)
    if chosen is None and cands:
        # the best was at its max count (rare: +me profiles): rank every candidate
        cands = _shortlist(snap.model_list, comp, mi, rpos, rkeys, ckeys, n)
        counts = Counter()
        chosen = _first_legal(snap.gpus, cands, counts)
    if chosen is None:
        full_r = np.full(n, _UNFIT, dtype=np.int64)
        full_r[rpos] = rkeys
        return _cannot_place(snap, job, params, policy, comp, ok, full_r, ckeys, counts)
    return explain_shortlist(snap.gpus, snap.models, job, params, policy, chosen, cands)


def explain_shortlist(
    gpus: Sequence[GpuView], models: Mapping[str, GpuModel], job: JobRequest, params: BalancerParams, policy: str,
    chosen: Cand, cands: Sequence[Cand],
) -> Placement:
    """The ``Placement`` of ``chosen`` (the first legal of ``cands``) with its runners-up from ``cands``."""
    ranked = cands if cands and cands[0] is chosen else [chosen, *(c for c in cands if c is not chosen)]
    return explain_choice(gpus, models, job, params.threshold, params.lazy_first, params.rank == "delta",
                          params.top_k, policy, chosen, ranked)


def _decision(
    snap: ClusterSnapshot, job: JobRequest, params: BalancerParams, policy: str, chosen: Cand,
    ranked: Sequence[Cand], reuse_insts: Mapping[int, InstanceView],
) -> Placement:
    """``explain_choice`` over a snapshot (the reference loop's entry, ``tests/reference_balancer.py``)."""
    return explain_choice(snap.gpus, snap.models, job, params.threshold, params.lazy_first,
                          params.rank == "delta", params.top_k, policy, chosen, ranked, reuse_insts)


def _shortlist(
    model_list: Sequence[GpuModel], comp: _Compiled, mi: npt.NDArray[np.intp] | Sequence[int],
    rpos: npt.NDArray[np.intp], rkeys: npt.NDArray[np.int64], ckeys: npt.NDArray[np.int64] | None, k: int,
) -> list[Cand]:
    """Candidates by (key, position): the exact best first, then about ``k`` runners-up of each action
    (ties among runners-up are cut by ``argpartition``, whose pick among equal keys depends on the whole array:
    ``PlacementIndex.decide`` hands this the very arrays ``place_mig`` builds, so that its runners-up are these)."""
    cands: list[Cand] = []
    for keys, where, action in ((rkeys, rpos, "reuse"), (ckeys, None, "create")):
        if keys is None or keys.size == 0:
            continue
        best = int(keys.argmin())  # the first of equal keys: the lowest position
        best_key = int(keys[best])
        if best_key >= _UNFIT:
            continue
        # (index into keys, key) pairs, read back as Python ints in one go: per-element numpy reads cost more
        found: list[tuple[int, int]]
        if k >= keys.size:
            fit = np.flatnonzero(keys < _UNFIT)
            found = list(zip(fit.tolist(), keys[fit].tolist(), strict=True))
        else:
            found = [(best, best_key)]
            if k > 0:
                part = keys.argpartition(k)[: k + 1]
                found += [(i, v) for i, v in zip(part.tolist(), keys[part].tolist(), strict=True)
                          if v < _UNFIT and i != best]
        for i, v in found:
            p = int(where[i]) if where is not None else i
            m = mi[p]
            prof = comp.profiles[m]
            assert prof is not None
            cands.append((v, p, model_list[m].name, prof, action))
    cands.sort(key=lambda c: (c[0], c[1]))
    return cands


def _cannot_place(
    snap: ClusterSnapshot, job: JobRequest, params: BalancerParams, policy: str, comp: _Compiled,
    ok: npt.NDArray[np.bool_], rkeys: npt.NDArray[np.int64], ckeys: npt.NDArray[np.int64] | None,
    counts: Counter[str],
) -> CannotPlace:
    """Why no GPU fits, as counts of GPUs per reason (computed only when nothing fits: off the hot path)."""
    mi = snap.model_idx
    for k, (model, prof) in enumerate(zip(snap.model_list, comp.profiles, strict=True)):
        on_model = mi == k
        if prof is None:
            counts[f"{model.name} has no profile for {job.demand.label()}"] += int(on_model.sum())
            continue
        counts["not in MIG mode or unhealthy"] += int((on_model & ~ok).sum())
        live = on_model & ok & (rkeys >= _UNFIT)
        if ckeys is None:
            what = f"instance covering {prof.name}" if params.allow_larger else prof.name
            counts[f"no idle {what} (static partitions)"] += int(live.sum())
        else:
            counts[f"no free {prof.name} placement"] += int((live & (ckeys >= _UNFIT)).sum())
    counts = Counter({k: v for k, v in counts.items() if v})
    reasons = tuple(f"{n} GPU(s): {why}" for why, n in counts.most_common()) or ("no GPU in the cluster",)
    return CannotPlace(job_id=job.job_id, policy=policy, reasons=reasons, counts=dict(counts))


def _first_legal(
    gpus: Sequence[GpuView], ranked: Sequence[Cand], counts: Counter[str] | None = None
) -> Cand | None:
    for cand in ranked:
        if cand[4] == "create" and not _count_ok(gpus[cand[1]], cand[3], 15 - (cand[0] & 0xF)):
            if counts is not None:
                counts[f"{cand[3].name} at its max count"] += 1
            continue
        return cand
    return None


def place_whole(
    snap: ClusterSnapshot, job: JobRequest, params: BalancerParams, policy: str = "balancer"
) -> Decision:
    """``gpus: n`` on one node, all or nothing: n empty MIG GPUs, each given its full-size instance.

    The node chosen is the one with the fewest empty GPUs that still has n (best fit keeps whole nodes free
    for bigger gangs); on it, GPUs holding an idle full-size instance first, then those with the least to
    destroy.
    """
    n = job.demand.gpus
    by_node: dict[str, list[GpuView]] = {}
    counts: Counter[str] = Counter()
    empty = np.flatnonzero((snap.busy == 0) & snap.mig & snap.healthy)
    for p in empty:
        g = snap.gpus[p]
        by_node.setdefault(g.node, []).append(g)
    counts["not empty, not MIG or unhealthy"] = len(snap) - int(empty.size)
    fitting = [(len(gs), node) for node, gs in by_node.items() if len(gs) >= n]
    if not fitting:
        most = max((len(v) for v in by_node.values()), default=0)
        return CannotPlace(
            job_id=job.job_id, policy=policy,
            reasons=(no_node_has(n, "empty", most, mig=True),), counts=dict(counts),
        )
    _, node = min(fitting)
    model_of = snap.geometry.model
    chosen = sorted(by_node[node], key=lambda g: whole_order(g, model_of(g.model)))[:n]
    return whole_placement(job, tuple(full_slot(g, model_of(g.model)) for g in chosen), policy)


def place(snap: ClusterSnapshot, job: JobRequest, params: BalancerParams | None = None) -> Decision:
    """The migsched balancer: one decision for one job over one snapshot."""
    params = params or BalancerParams()
    if job.demand.kind == "gpus":
        # the one rule for gangs bigger than every node, and for gangs kept within a topology domain (imported
        # here: they build their slots with this module's)
        from shared.policy.placement.gang import place_across, spans_nodes
        from shared.policy.placement.topology import within_domains

        if job.domains:
            return within_domains(snap, job, lambda s, j: place(s, j, params))
        if spans_nodes(snap, job.demand):
            return place_across(snap, job, "balancer")
    if job.demand.kind == "gpus":
        # plain (non-MIG) GPUs first: true whole GPUs with peer-to-peer; then entirely free MIG GPUs
        plain = place_plain_gpus(snap, job)
        if isinstance(plain, Placement):
            return plain
        whole = place_whole(snap, job, params)
        if isinstance(whole, Placement):
            return whole
        return gang_reasons(snap, plain, whole)
    if job.demand.kind == "shared":
        return place_share(snap, job)
    return place_mig(snap, job, params)

