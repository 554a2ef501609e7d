"""Placement policies to compare migsched against, selectable by name.

Every policy is a pure ``(ClusterSnapshot, JobRequest) -> Decision`` and obeys the same legality rules as the
balancer: healthy GPUs in MIG mode, legal placements only, no overlap with a busy instance, max counts. The
dynamic baselines reuse an idle instance of the exact profile when the GPU they chose has one (lowest start;
highest for ``driver-default``); otherwise they create one, preferring a start that destroys no idle instance.
Each is vectorised over the snapshot columns with per-model look-up tables, like the balancer, so simulations
of thousands of GPUs stay cheap.

- ``first-fit``: the first GPU in snapshot order that fits, lowest legal start.
- ``best-fit``: the fitting GPU with the fewest free memory slices (idle ones count as free), lowest start.
- ``spread``: worst-fit, the fitting GPU with the most free slices, lowest start.
- ``driver-default``: the first GPU that fits, highest start (the driver's habit without a placement).
- ``fgd``: FGD applied to MIG: the placement that least increases the GPU's expected unusable free slices
  under the demand mix ``weights`` (shape -> share, see ``fragcost.frag_rate``).
- ``static``: a fixed layout per GPU (``static_layout``), never repartitioned; a job takes the smallest idle
  instance that covers it (first GPU on ties).
- ``lb-static``: the conditional load balancer restricted to a static layout (load balancing only).
- ``migsched`` / ``migsched-nomig``: the balancer, with / without the migration planner.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from shared.errors import MigschedError
from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span
from shared.mig.tables import PAIRS, popcount_table, tables_for
from shared.policy.balancer import BalancerParams, place
from shared.policy.fragcost import (
    FGD_OFFSET,
    FGD_SCALE,
    UNIFORM_SHAPES,
    fgd_create_table,
    frag_slices_table,
    weights_key,
)
from shared.policy.placement import CannotPlace, Decision, JobRequest, Placement, Slot
from shared.policy.request import full_profile, resolve_profile
from shared.policy.snapshot import ClusterSnapshot, GpuView
from shared.policy.static_layouts import LayoutError, static_layout

__all__ = ["LayoutError", "PlacementPolicy", "PolicySpec", "UnknownPolicyError", "get_policy", "policy_names",
           "static_layout"]

PlacementPolicy = Callable[[ClusterSnapshot, JobRequest], Decision]


class PolicySpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str
    repartitions: bool
    """False = static: the policy never creates or destroys instances."""
    initial_layout: str | None = None
    """A ``static_layout`` name applied to every GPU before the run, e.g. ``all-balanced``."""
    migrates: bool = False
    migrate_intra: bool = True
    """Which move kinds the migration planner may plan (``MigrationParams.intra``/``inter``)."""
    migrate_inter: bool = True
    pull_into_empty: bool = True
    consolidate: bool = False


class UnknownPolicyError(MigschedError, KeyError):
    """No policy of that name, or a parameter the policy does not take."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown policy"


# -- shared pieces ---------------------------------------------------------------------------------

def _col(column: Any) -> npt.NDArray[Any]:
    return np.asarray(column)


def _ok(snap: ClusterSnapshot, pos: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_]:
    return np.asarray(snap.mig[pos], dtype=bool) & np.asarray(snap.healthy[pos], dtype=bool)


def _count_ok(gpu: GpuView, prof: Profile, pm: int) -> bool:
    """Room for one more ``prof`` once the idle instances under ``pm`` are destroyed (partition's rule)."""
    n = sum(1 for i in gpu.instances if i.profile == prof.name and not (not i.busy and i.mask & pm))
    return n < prof.max_count


def _create(gpu: GpuView, model: GpuModel, prof: Profile, start: int) -> Slot:
    pm = span(prof.memory_slices, start)
    return Slot(
        gpu_id=gpu.id, node=gpu.node, model=model.name, profile=prof.name, start=start,
        size=prof.memory_slices, compute=prof.compute_slices, action="create",
        destroy=tuple(i.id for i in gpu.instances if not i.busy and i.mask & pm),
    )


def _reuse(gpu: GpuView, model: GpuModel, inst_id: str) -> Slot:
    inst = gpu.instance(inst_id)
    assert inst is not None
    return Slot(
        gpu_id=gpu.id, node=gpu.node, model=model.name, profile=inst.profile, start=inst.start,
        size=inst.size, compute=inst.compute, action="reuse", instance_id=inst.id,
    )


def _placement(snap: ClusterSnapshot, job: JobRequest, policy: str, slot: Slot, why: str) -> Placement:
    gpu = snap.gpu(slot.gpu_id)
    tables = tables_for(snap.geometry.model(gpu.model))
    after = gpu.busy_mask | span(slot.size, slot.start)
    action = f"reuses idle instance {slot.instance_id}" if slot.action == "reuse" else "creates an instance"
    reasons = [why, action]
    if slot.destroy:
        reasons.append(f"destroys {len(slot.destroy)} idle instance(s) in the way")
    return Placement(
        job_id=job.job_id, policy=policy, slots=(slot,), tier="any", frag_before=tables.cost(gpu.busy_mask),
        frag_after=tables.cost(after), reasons=tuple(reasons),
    )


def _cannot(job: JobRequest, policy: str, counts: Mapping[str, int]) -> CannotPlace:
    reasons = tuple(f"{n} GPU(s): {why}" for why, n in sorted(counts.items(), key=lambda kv: -kv[1]) if n)
    return CannotPlace(job_id=job.job_id, policy=policy, reasons=reasons or ("no GPU in the cluster",),
                       counts={k: v for k, v in counts.items() if v})


@functools.cache
def _start_table(model: GpuModel, profile: str, highest: bool) -> npt.NDArray[np.int8]:
    """Per ``busy << 8 | idle``: the lowest (or highest) start free of busy slices, preferring one that
    overlaps no idle instance; -1 when none."""
    prof = model.profile(profile)
    pairs = np.arange(PAIRS, dtype=np.int64)
    busy, idle = pairs >> 8, pairs & 0xFF
    clean = np.full(PAIRS, -1, dtype=np.int8)
    dirty = np.full(PAIRS, -1, dtype=np.int8)
    for s in sorted(prof.placements, reverse=not highest):  # later writes win: the preferred end is last
        pm = span(prof.memory_slices, s)
        free = (busy & pm) == 0
        dirty[free] = s
        clean[free & ((idle & pm) == 0)] = s
    out = np.where(clean >= 0, clean, dirty).astype(np.int8)
    out.setflags(write=False)
    return out


def _idle_start(gpu: GpuView, prof: Profile, highest: bool) -> str | None:
    starts = [(i.start, i.id) for i in gpu.instances if not i.busy and i.profile == prof.name]
    if not starts:
        return None
    return (max(starts) if highest else min(starts))[1]


# -- the simple dynamic baselines ------------------------------------------------------------------

Ranker = Callable[[ClusterSnapshot, npt.NDArray[np.intp], GpuModel], npt.NDArray[np.int64]]


def _rank_first(snap: ClusterSnapshot, pos: npt.NDArray[np.intp], model: GpuModel) -> npt.NDArray[np.int64]:
    return pos.astype(np.int64)


def _free(snap: ClusterSnapshot, pos: npt.NDArray[np.intp], model: GpuModel) -> npt.NDArray[np.int64]:
    return model.memory_slices - popcount_table()[snap.busy[pos]].astype(np.int64)


def _rank_best(snap: ClusterSnapshot, pos: npt.NDArray[np.intp], model: GpuModel) -> npt.NDArray[np.int64]:
    return (_free(snap, pos, model) << 40) + pos


def _rank_spread(snap: ClusterSnapshot, pos: npt.NDArray[np.intp], model: GpuModel) -> npt.NDArray[np.int64]:
    return ((8 - _free(snap, pos, model)) << 40) + pos


def _simple(name: str, rank: Ranker, highest: bool) -> PlacementPolicy:
    """A policy that ranks fitting GPUs by ``rank`` (lowest first) and then places on the chosen GPU."""

    def policy(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        if job.demand.kind != "mig":
            return _not_mig(snap, job, name)
        excluded: set[int] = set()
        at_max = 0
        while True:
            counts: dict[str, int] = {}
            if at_max:
                counts[f"{job.demand.label()} at its max count"] = at_max
            best: tuple[int, int, GpuModel, Profile] | None = None
            for model_name, pos in snap.groups.items():
                model = snap.models[model_name]
                prof = resolve_profile(job.demand, model)
                if prof is None:
                    counts[f"{model_name} has no profile for {job.demand.label()}"] = pos.size
                    continue
                ok = _ok(snap, pos)
                counts["not in MIG mode or unhealthy"] = counts.get("not in MIG mode or unhealthy", 0) + int(
                    (~ok).sum())
                bit = np.uint32(1 << tables_for(model).index[prof.name])
                pair = (_col(snap.busy)[pos].astype(np.intp) << 8) | _col(snap.idle)[pos]
                starts = _start_table(model, prof.name, highest)[pair]
                fits = ok & ((_col(snap.idle_profiles)[pos] & bit) != 0) | (ok & (starts >= 0))
                if excluded:
                    fits &= ~np.isin(pos, list(excluded))
                counts[f"no free {prof.name} placement"] = int((ok & ~fits).sum())
                if not fits.any():
                    continue
                keys = rank(snap, pos[fits], model)
                i = int(np.argmin(keys))
                cand = (int(keys[i]), int(pos[fits][i]), model, prof)
                if best is None or cand[:2] < best[:2]:
                    best = cand
            if best is None:
                return _cannot(job, name, counts)
            _, p, model, prof = best
            gpu = snap.gpus[p]
            inst_id = _idle_start(gpu, prof, highest)
            if inst_id is not None:
                return _placement(snap, job, name, _reuse(gpu, model, inst_id), f"{name}: GPU {gpu.id}")
            start = int(_start_table(model, prof.name, highest)[gpu.busy_mask << 8 | gpu.idle_mask])
            if _count_ok(gpu, prof, span(prof.memory_slices, start)):
                return _placement(snap, job, name, _create(gpu, model, prof, start), f"{name}: GPU {gpu.id}")
            at_max += 1
            excluded.add(p)

    return policy


def _not_mig(snap: ClusterSnapshot, job: JobRequest, name: str) -> Decision:
    """Whole GPUs and time-sliced shares go the balancer's way for every baseline (their policies are not
    what the baselines compare)."""
    return msgspec.structs.replace(place(snap, job, BalancerParams()), policy=name)


# -- FGD -------------------------------------------------------------------------------------------

def _fgd(name: str, weights: Mapping[str, float]) -> PlacementPolicy:
    wkey = weights_key(weights)
    if not wkey:
        raise UnknownPolicyError(f"{name}: 'weights' needs at least one positive share")

    def policy(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        if job.demand.kind != "mig":
            return _not_mig(snap, job, name)
        best: tuple[int, int, GpuModel, Profile, str | None, int] | None = None
        excluded: set[int] = set()
        at_max = 0
        while True:
            counts: dict[str, int] = {f"{job.demand.label()} at its max count": at_max}
            best = None
            for model_name, pos in snap.groups.items():
                model = snap.models[model_name]
                prof = resolve_profile(job.demand, model)
                if prof is None:
                    counts[f"{model_name} has no profile for {job.demand.label()}"] = pos.size
                    continue
                ok = _ok(snap, pos)
                if excluded:
                    ok &= ~np.isin(pos, list(excluded))
                counts["not in MIG mode or unhealthy"] = counts.get("not in MIG mode or unhealthy", 0) + int(
                    (~_ok(snap, pos)).sum())
                start_t, d_t, o_t = fgd_create_table(model, prof.name, wkey)
                pair = (_col(snap.busy)[pos].astype(np.intp) << 8) | _col(snap.idle)[pos]
                start = start_t[pair]
                fits = ok & (start >= 0)
                if fits.any():
                    keys = ((d_t[pair] + FGD_OFFSET) << 37) + (1 << 36) + (o_t[pair] << 32) + pos
                    keys = np.where(fits, keys, np.iinfo(np.int64).max)
                    i = int(np.argmin(keys))
                    cand = (int(keys[i]), int(pos[i]), model, prof, None, int(start[i]))
                    if best is None or cand[:2] < best[:2]:
                        best = cand
                frag = frag_slices_table(model, dict(wkey))
                bit = np.uint32(1 << tables_for(model).index[prof.name])
                has = ok & ((_col(snap.idle_profiles)[pos] & bit) != 0)
                counts[f"no free {prof.name} placement"] = int((ok & ~fits & ~has).sum())
                for p in pos[has].tolist():
                    gpu = snap.gpus[p]
                    for inst in gpu.instances:
                        if inst.busy or inst.profile != prof.name:
                            continue
                        d = round(float(frag[gpu.busy_mask | inst.mask] - frag[gpu.busy_mask]) * FGD_SCALE)
                        k = ((d + FGD_OFFSET) << 37) + p
                        cand = (k, p, model, prof, inst.id, inst.start)
                        if best is None or (cand[0], cand[1], -cand[5]) < (best[0], best[1], -best[5]):
                            best = cand
            if best is None:
                return _cannot(job, name, counts)
            key, p, model, prof, inst_id, start = best
            gpu = snap.gpus[p]
            change = ((key >> 37) - FGD_OFFSET) / FGD_SCALE
            why = f"{name}: least increase of unusable free slices ({change:+.3f})"
            if inst_id is not None:
                return _placement(snap, job, name, _reuse(gpu, model, inst_id), why)
            if _count_ok(gpu, prof, span(prof.memory_slices, start)):
                return _placement(snap, job, name, _create(gpu, model, prof, start), why)
            at_max += 1
            excluded.add(p)

    return policy


# -- static partitions -----------------------------------------------------------------------------

def _covering(model: GpuModel, prof: Profile) -> list[Profile]:
    """Profiles whose instance can host a job sized for ``prof``, smallest first."""
    out = [
        p for p in model.profiles
        if p.compute_slices >= prof.compute_slices and p.memory_slices >= prof.memory_slices
        and p.memory_gib + 1e-9 >= prof.memory_gib and p.media_extensions == prof.media_extensions
    ]
    return sorted(out, key=lambda p: (p.memory_slices, p.compute_slices, p.memory_gib, p.name))


def _static_whole(snap: ClusterSnapshot, job: JobRequest, name: str) -> Decision:
    """``gpus: n`` under a static layout: n GPUs of one node laid out as one idle full-size instance."""
    n = job.demand.gpus
    by_node: dict[str, list[tuple[GpuView, str]]] = {}
    for p, gpu in enumerate(snap.gpus):
        if not (snap.mig[p] and snap.healthy[p]) or gpu.busy_mask or len(gpu.instances) != 1:
            continue
        model = snap.geometry.model(gpu.model)
        inst = gpu.instances[0]
        if inst.profile == full_profile(model).name:
            by_node.setdefault(gpu.node, []).append((gpu, inst.id))
    fitting = sorted((len(v), node) for node, v in by_node.items() if len(v) >= n)
    if not fitting:
        return CannotPlace(job_id=job.job_id, policy=name, reasons=(
            f"no node has {n} GPU(s) laid out as one idle full-size instance (static layout)",))
    node = fitting[0][1]
    chosen = sorted(by_node[node], key=lambda gi: gi[0].index)[:n]
    slots = tuple(_reuse(g, snap.geometry.model(g.model), iid) for g, iid in chosen)
    return Placement(job_id=job.job_id, policy=name, slots=slots, tier="any", frag_before=0.0, frag_after=1.0,
                     reasons=(f"{n} whole GPU(s) on node {node}, static full-size instances",))


def _static(name: str) -> PlacementPolicy:
    def policy(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        if job.demand.kind == "gpus":
            return _static_whole(snap, job, name)
        if job.demand.kind != "mig":
            return _not_mig(snap, job, name)
        counts: dict[str, int] = {}
        best: tuple[tuple[int, int, int], GpuModel, Profile] | None = None
        for model_name, pos in snap.groups.items():
            model = snap.models[model_name]
            prof = resolve_profile(job.demand, model)
            if prof is None:
                counts[f"{model_name} has no profile for {job.demand.label()}"] = pos.size
                continue
            ok = _ok(snap, pos)
            counts["not in MIG mode or unhealthy"] = counts.get("not in MIG mode or unhealthy", 0) + int(
                (~ok).sum())
            index = tables_for(model).index
            idle_bits = _col(snap.idle_profiles)[pos]
            for cover in _covering(model, prof):
                hit = np.flatnonzero(ok & ((idle_bits & np.uint32(1 << index[cover.name])) != 0))
                if hit.size:
                    key = (cover.memory_slices, cover.compute_slices, int(pos[hit[0]]))
                    if best is None or key < best[0]:
                        best = (key, model, cover)
                    break
            else:
                counts[f"no idle instance covering {prof.name}"] = int(ok.sum())
        if best is None:
            return _cannot(job, name, counts)
        (_, _, p), model, cover = best
        gpu = snap.gpus[p]
        inst_id = _idle_start(gpu, cover, highest=False)
        assert inst_id is not None
        return _placement(snap, job, name, _reuse(gpu, model, inst_id),
                          f"{name}: smallest idle instance that covers the job ({cover.name})")

    return policy


def _lb_static(name: str, params: BalancerParams) -> PlacementPolicy:
    def policy(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        if job.demand.kind == "gpus":
            return _static_whole(snap, job, name)
        decision = place(snap, job, params)  # shares of plain GPUs go the balancer's way
        return msgspec.structs.replace(decision, policy=name)

    return policy


def _balancer(name: str, params: BalancerParams) -> PlacementPolicy:
    def policy(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        decision = place(snap, job, params)
        return msgspec.structs.replace(decision, policy=name)

    # exactly ``place`` with these parameters, so the simulator may answer it with its PlacementIndex
    policy.balancer_params = params  # type: ignore[attr-defined]
    return policy


# -- the registry ----------------------------------------------------------------------------------

_BALANCER_KEYS = ("threshold", "lazy_first", "top_k", "rank")
_MIGRATION_KEYS = ("intra", "inter", "pull_into_empty", "consolidate")
_SPECS: dict[str, tuple[str, tuple[str, ...]]] = {
    "migsched": ("conditional load balancer + dynamic partitioning + migration (the seeds' full scheme)",
                 (*_BALANCER_KEYS, *_MIGRATION_KEYS)),
    "migsched-nomig": ("conditional load balancer + dynamic partitioning, no migration", _BALANCER_KEYS),
    "migsched-pack": ("migsched tuned for whole-GPU-heavy traces: rank by FragCost increase, no Lazy-first "
                      "tier, no pulls into empty GPUs, consolidation of lightly used GPUs",
                      (*_BALANCER_KEYS, *_MIGRATION_KEYS)),
    "first-fit": ("first GPU in snapshot order that fits, lowest legal start", ()),
    "best-fit": ("fitting GPU with the fewest free memory slices, lowest start", ()),
    "spread": ("worst-fit: fitting GPU with the most free memory slices, lowest start", ()),
    "driver-default": ("first GPU that fits, highest-index start (NVIDIA driver's habit)", ()),
    "fgd": ("FGD-style: least increase of free slices the demand mix cannot use", ("weights",)),
    "static": ("fixed layout per GPU, never repartitioned; smallest idle instance that covers the job",
               ("layout",)),
    "lb-static": ("conditional load balancer over a static layout (load balancing only)",
                  ("layout", *_BALANCER_KEYS)),
}


PACK_DEFAULTS: dict[str, Any] = {"rank": "delta", "lazy_first": False, "pull_into_empty": False,
                                 "consolidate": True}
"""What ``migsched-pack`` changes from ``migsched``."""


def policy_names() -> list[str]:
    return list(_SPECS)


def get_policy(name: str, **params: Any) -> tuple[PolicySpec, PlacementPolicy]:
    """The named policy with its parameters bound; an unknown name or parameter raises UnknownPolicyError."""
    if name not in _SPECS:
        raise UnknownPolicyError(f"unknown policy {name!r}; known policies: {', '.join(_SPECS)}")
    description, accepted = _SPECS[name]
    extra = sorted(set(params) - set(accepted))
    if extra:
        takes = ", ".join(accepted) or "none"
        raise UnknownPolicyError(
            f"policy {name!r} takes no parameter(s) {', '.join(extra)}; it takes: {takes}")
    bal = {k: params[k] for k in _BALANCER_KEYS if k in params}
    if name == "migsched-pack":
        # defaults of the variant, each still overridable (see docs/results-sim.md for the evidence)
        params = {**PACK_DEFAULTS, **params}
        bal = {k: params[k] for k in _BALANCER_KEYS if k in params}
    if name in ("migsched", "migsched-nomig", "migsched-pack"):
        spec = PolicySpec(name=name, description=description, repartitions=True,
                          migrates=name != "migsched-nomig",
                          migrate_intra=bool(params.get("intra", True)),
                          migrate_inter=bool(params.get("inter", True)),
                          pull_into_empty=bool(params.get("pull_into_empty", True)),
                          consolidate=bool(params.get("consolidate", False)))
        return spec, _balancer(name, BalancerParams(**bal))
    simple = {"first-fit": (_rank_first, False), "best-fit": (_rank_best, False),
              "spread": (_rank_spread, False), "driver-default": (_rank_first, True)}
    if name in simple:
        rank, highest = simple[name]
        return PolicySpec(name=name, description=description, repartitions=True), _simple(name, rank, highest)
    if name == "fgd":
        weights = params.get("weights") or UNIFORM_SHAPES
        return PolicySpec(name=name, description=description, repartitions=True), _fgd(name, weights)
    layout = str(params.get("layout", "all-balanced"))
    if not layout.startswith("all-"):
        raise LayoutError(f"unknown layout {layout!r}: use all-balanced, all-<shape> or all-<profile>")
    spec = PolicySpec(name=name, description=description, repartitions=False, initial_layout=layout)
    if name == "static":
        return spec, _static(name)
    return spec, _lb_static(name, BalancerParams(dynamic=False, allow_larger=True, **bal))
