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

from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span
from shared.mig.tables import popcount_table, tables_for
from shared.policy.balancer import BalancerParams, place
from shared.policy.baseline_slots import (
    PlacementPolicy,
    UnknownPolicyError,
    cannot_place,
    column,
    count_ok,
    create_slot,
    explained,
    idle_instance,
    not_mig,
    reuse_slot,
    start_table,
    usable,
)
from shared.policy.fgd_policy import fgd_policy
from shared.policy.fragcost import (
    UNIFORM_SHAPES,
)
from shared.policy.placement import Decision, JobRequest
from shared.policy.request import resolve_profile
from shared.policy.snapshot import ClusterSnapshot
from shared.policy.static_layouts import LayoutError, static_layout
from shared.policy.static_policy import lb_static_policy, static_policy

__all__ = ["LayoutError", "PlacementPolicy", "PolicySpec", "UnknownPolicyError", "get_policy", "policy_names",
           "static_layout"]



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
            return not_mig(snap, job, name)
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
                ok = usable(snap, pos)
                counts["not in MIG mode or unhealthy"] = counts.get("not in MIG mode or unhealthy", 0) + int(
                    (~ok).sum())
                bit = np.uint32(1 << tables_for(model).index[prof.name])
                pair = (column(snap.busy)[pos].astype(np.intp) << 8) | column(snap.idle)[pos]
                starts = start_table(model, prof.name, highest)[pair]
                fits = ok & ((column(snap.idle_profiles)[pos] & bit) != 0) | (ok & (starts >= 0))
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
                return cannot_place(job, name, counts)
            _, p, model, prof = best
            gpu = snap.gpus[p]
            inst_id = idle_instance(gpu, prof, highest)
            if inst_id is not None:
                return explained(snap, job, name, reuse_slot(gpu, model, inst_id), f"{name}: GPU {gpu.id}")
            start = int(start_table(model, prof.name, highest)[gpu.busy_mask << 8 | gpu.idle_mask])
            if count_ok(gpu, prof, span(prof.memory_slices, start)):
                return explained(snap, job, name, create_slot(gpu, model, prof, start), f"{name}: GPU {gpu.id}")
            at_max += 1
            excluded.add(p)

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
        return PolicySpec(name=name, description=description, repartitions=True), fgd_policy(name, weights)
    layout = str(params.get("layout", "all-balanced"))
    if not layout.startswith("all-"):
        raise LayoutError(f"unknown layout {layout!r}: use all-balanced, all-<shape> or all-<profile>")
    spec = PolicySpec(name=name, description=description, repartitions=False, initial_layout=layout)
    if name == "static":
        return spec, static_policy(name)
    return spec, lb_static_policy(name, BalancerParams(dynamic=False, allow_larger=True, **bal))
