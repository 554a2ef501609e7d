"""The seeds' scheme (``shared.policy.placement.balancer``): the conditional load balancer with dynamic partitioning and
the migration planner, kept for the comparison with the article.

- ``paper``: Lazy GPUs first, reuse, lowest FragCost after the placement; migration after exits and every
  defragmentation tick.
- ``paper-nomig``: the same placement, no migration.
- ``paper-pack``: rank by FragCost increase, no Lazy-first tier, no pulls into empty GPUs, consolidation of
  lightly used GPUs.
"""

from __future__ import annotations

from typing import Any

import msgspec

from shared.policy.placement.balancer import BalancerParams, place_mig, place_whole
from shared.policy.placement.decision import Decision, JobRequest
from shared.policy.placement.registry import PolicySpec, Rules, register
from shared.policy.snapshot import ClusterSnapshot

BALANCER_KEYS = ("threshold", "lazy_first", "top_k", "rank")
MIGRATION_KEYS = ("intra", "inter", "pull_into_empty", "consolidate")
PACK_DEFAULTS: dict[str, Any] = {"rank": "delta", "lazy_first": False, "pull_into_empty": False,
                                 "consolidate": True}
"""What ``paper-pack`` changes from ``paper``."""


def balancer_rules(params: BalancerParams) -> Rules:
    """Exactly ``balancer.place`` with ``params``, so the simulator and the mirror may answer from their
    ``PlacementIndex``."""

    def mig(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        return place_mig(snap, job, params)

    def gang(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        return place_whole(snap, job, params)

    return Rules(mig=mig, gang=gang, balancer_params=params)


def _build(spec: PolicySpec, params: dict[str, Any], defaults: dict[str, Any]) -> tuple[PolicySpec, Rules]:
    params = {**defaults, **params}
    bal = {k: params[k] for k in BALANCER_KEYS if k in params}
    if spec.migrates:
        spec = msgspec.structs.replace(
            spec, migrate_intra=bool(params.get("intra", True)), migrate_inter=bool(params.get("inter", True)),
            pull_into_empty=bool(params.get("pull_into_empty", True)),
            consolidate=bool(params.get("consolidate", False)))
    return spec, balancer_rules(BalancerParams(**bal))


@register(PolicySpec(name="paper", description="the seeds' scheme: conditional load balancer + dynamic "
                     "partitioning + migration", migrates=True, takes_threshold=True),
          accepts=(*BALANCER_KEYS, *MIGRATION_KEYS))
def _paper(spec: PolicySpec, params: dict[str, Any]) -> tuple[PolicySpec, Rules]:
    return _build(spec, params, {})


@register(PolicySpec(name="paper-nomig", description="the seeds' conditional load balancer + dynamic "
                     "partitioning, no migration", takes_threshold=True), accepts=BALANCER_KEYS)
def _paper_nomig(spec: PolicySpec, params: dict[str, Any]) -> tuple[PolicySpec, Rules]:
    return _build(spec, params, {})


@register(PolicySpec(name="paper-pack", description="the seeds' scheme tuned for whole-GPU-heavy traces: rank "
                     "by FragCost increase, no Lazy-first tier, no pulls into empty GPUs, consolidation",
                     migrates=True, pull_into_empty=False, consolidate=True, takes_threshold=True),
          accepts=(*BALANCER_KEYS, *MIGRATION_KEYS))
def _paper_pack(spec: PolicySpec, params: dict[str, Any]) -> tuple[PolicySpec, Rules]:
    return _build(spec, params, PACK_DEFAULTS)
