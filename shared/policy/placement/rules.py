"""A policy as the engine sees it: its own rules for the demands it scores, composed with the rules every policy
shares.

A plug-in gives ``Rules``: where a MIG request goes (``mig``), and optionally where a whole-GPU gang on one node
goes (``gang``; by default the balancer's best fit). ``compose`` adds the rest, the same for every policy:

- a time-sliced share goes to the plain GPU with the most room (``sharing.place_share``);
- a gang tries whole plain (non-MIG) GPUs first (``sharing.place_plain_gpus``) unless the policy lays out its
  own (``plain_first=False``: the static layouts), and a gang that finds neither gives both reasons;
- every decision carries the policy's name.

Gangs bigger than every node and gangs kept within a topology domain are the registry's, around this.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from shared.policy.placement.alignment import AlignParams
from shared.policy.placement.balancer import BalancerParams, place_whole
from shared.policy.placement.decision import CannotPlace, Decision, JobRequest, Placement
from shared.policy.placement.sharing import gang_reasons, place_plain_gpus, place_share
from shared.policy.placement.slots import PlacementPolicy
from shared.policy.snapshot import ClusterSnapshot

Rule = Callable[[ClusterSnapshot, JobRequest], Decision]


class Rules(msgspec.Struct, frozen=True, kw_only=True):
    mig: Rule
    """Where a MIG request goes."""
    gang: Rule | None = None
    """Where ``gpus: n`` goes on one node once plain GPUs are out (None: the balancer's ``place_whole``)."""
    plain_first: bool = True
    """Offer a gang whole plain GPUs before ``gang`` (the static layouts lay out their own)."""
    balancer_params: BalancerParams | None = None
    """Set when the rules are exactly ``balancer.place`` with these parameters: the simulator and the mirror may
    then answer from their incremental ``PlacementIndex``."""
    align_params: AlignParams | None = None
    """Set when the MIG rule is exactly ``migsched``'s with these parameters: the simulator may then answer from
    its incremental ``AlignIndex``."""


def _whole(snap: ClusterSnapshot, job: JobRequest) -> Decision:
    return place_whole(snap, job, BalancerParams())


def compose(name: str, rules: Rules) -> PlacementPolicy:
    """The policy ``name``: ``rules`` and the shared ones (see the module docstring)."""
    gang = rules.gang or _whole

    def policy(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        kind = job.demand.kind
        if kind == "shared":
            decision = place_share(snap, job)
        elif kind == "gpus":
            plain = place_plain_gpus(snap, job) if rules.plain_first else None
            if isinstance(plain, Placement):
                decision = plain
            else:
                decision = gang(snap, job)
                if plain is not None and isinstance(decision, CannotPlace):
                    decision = gang_reasons(snap, plain, decision)
        else:
            decision = rules.mig(snap, job)
        return decision if decision.policy == name else msgspec.structs.replace(decision, policy=name)

    policy.policy_name = name  # type: ignore[attr-defined]
    if rules.balancer_params is not None:
        policy.balancer_params = rules.balancer_params  # type: ignore[attr-defined]
    if rules.align_params is not None:
        policy.align_params = rules.align_params  # type: ignore[attr-defined]
    return policy
