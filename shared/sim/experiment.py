"""Runs of several policies over one workload and cluster: the comparison, the threshold sweep, the ablation.

Policies come from ``shared.policy.placement.registry`` by name, with the run's parameters bound (threshold for the
balancer family, the layout for the static ones, the workload's demand mix for FGD).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from shared.mig.geometry import Geometry, default_geometry
from shared.policy.placement.plugins.fgd import typical_pods
from shared.policy.placement.registry import accepts, describe, get_policy, parse_label, policy_names
from shared.sim.cluster import ClusterSpec
from shared.sim.config import SimConfig
from shared.sim.engine import Simulator
from shared.sim.fluid import NAME as FLUID
from shared.sim.fluid import run_fluid
from shared.sim.jobs import Workload
from shared.sim.metrics import RunResult

ABLATION = ("lb-static", "paper-nomig", "paper")
"""The seeds' scheme taken apart: load balancing only, + dynamic partitioning, + migration."""

THRESHOLD_POLICIES = {n for n in policy_names() if describe(n).takes_threshold}
LAYOUT_POLICIES = {n for n in policy_names() if not describe(n).repartitions}

Progress = Callable[[str, int, int], None]
"""(run label, jobs ended, jobs) -- called every few thousand events."""


def policy_params(name: str, workload: Workload, cfg: SimConfig) -> dict[str, object]:
    params: dict[str, object] = {}
    if name in THRESHOLD_POLICIES:
        params["threshold"] = cfg.threshold
    if "top_k" in accepts(name):
        # the simulator reads only the choice, never the runners-up a decision lists to explain itself
        params["top_k"] = 0
    if name in LAYOUT_POLICIES:
        params["layout"] = cfg.static_layout if cfg.static_layout != "mix" else "all-balanced"
    if name == "fgd":
        # the target workload with hindsight, as the paper takes it
        params["pods"] = typical_pods((j.shape, j.gpus) for j in workload.jobs)
    return params


def run_one(
    workload: Workload,
    cluster: ClusterSpec,
    name: str,
    cfg: SimConfig,
    *,
    geometry: Geometry | None = None,
    progress: Progress | None = None,
    label: str | None = None,
    check: bool = False,
    params: dict[str, object] | None = None,
) -> RunResult:
    """One policy run. A static policy gets ``cfg.static_layout`` (``mix`` is applied by the engine);
    ``params`` override the run's defaults for the policy. ``fluid`` is the pooled-cluster bound
    (``shared.sim.fluid``), not a placement policy."""
    if name == FLUID:
        return run_fluid(workload, cluster, cfg, geometry)
    spec, policy = get_policy(name, **{**policy_params(name, workload, cfg), **(params or {})})
    if name in LAYOUT_POLICIES:
        spec = msgspec.structs.replace(spec, initial_layout=cfg.static_layout)
    tag = label or name
    cb = (lambda done, total: progress(tag, done, total)) if progress is not None else None
    sim = Simulator(
        workload, cluster, spec, policy, cfg, geometry=geometry or default_geometry(), progress=cb
    )
    if check:
        sim.cfg = msgspec.structs.replace(cfg, check_invariants=True)
    result = sim.run()
    if progress is not None:
        progress(tag, len(workload.jobs), len(workload.jobs))
    return result


def compare(
    workload: Workload, cluster: ClusterSpec, names: Sequence[str], cfg: SimConfig, **kw: object
) -> list[RunResult]:
    """One run per label: a policy name, or ``name[param=value,...]`` (``first-fit[reserve=on]``)."""
    out = []
    for label in names:
        name, params = parse_label(label)
        r = run_one(workload, cluster, name, cfg, label=label, params=params or None, **kw)  # type: ignore[arg-type]
        out.append(msgspec.structs.replace(r, kpis=msgspec.structs.replace(r.kpis, policy=label)) if params else r)
    return out


def sweep(
    workload: Workload,
    cluster: ClusterSpec,
    thresholds: Sequence[float],
    cfg: SimConfig,
    name: str = "paper",
    **kw: object,
) -> list[RunResult]:
    out = []
    for t in thresholds:
        c = msgspec.structs.replace(cfg, threshold=t)
        out.append(run_one(workload, cluster, name, c, label=f"{name} t={t:g}", **kw))  # type: ignore[arg-type]
    return out


def ablation(workload: Workload, cluster: ClusterSpec, cfg: SimConfig, **kw: object) -> list[RunResult]:
    return compare(workload, cluster, ABLATION, cfg, **kw)


def all_policies() -> list[str]:
    return policy_names()
