"""Decisions as data: a placement with its score, reasons and runner-up candidates, or "cannot place"."""

from __future__ import annotations

from typing import Literal

import msgspec

from shared.policy.request import Demand

Action = Literal["create", "reuse"]
Tier = Literal["lazy", "busy", "any"]


class JobRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What the policies need to know about a job to place it."""

    job_id: str
    demand: Demand
    tenant: str = "default"
    priority: int = 0
    latency_sensitive: bool = False
    migratable: bool = True
    duration_hint_s: float | None = None
    """How long the job expects to run; None = it gave no hint (time-aware policies then only pack)."""
    now: float | None = None
    """The decision's clock, handed in by the caller (policies read no clock); None = unknown."""
    domains: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """A gang kept within one topology domain: each domain's name and nodes, resolved by the caller from the
    nodes' labels (``shared.policy.placement.topology``); empty = anywhere."""
    domain_level: str = ""
    """The label the domains are of (``block``, ``rack``), for the reasons."""
    domain_required: bool = False
    """Wait for one domain to hold the gang (True) or place it across domains when none does (False)."""
    submitted_at: float | None = None
    """When the job was submitted (with ``now``: how long it has waited); None = unknown."""

    def waited_s(self) -> float | None:
        """How long the job has waited (None without a clock or a submission time)."""
        return None if self.now is None or self.submitted_at is None else self.now - self.submitted_at


class Slot(msgspec.Struct, frozen=True, kw_only=True):
    """One instance a placement uses: where, which profile, and whether it is created or reused."""

    gpu_id: str
    node: str
    model: str
    profile: str
    start: int
    size: int
    compute: int
    action: Action
    instance_id: str | None = None
    destroy: tuple[str, ...] = ()


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    gpu_id: str
    profile: str
    start: int
    action: Action
    tier: Tier
    frag_before: float
    frag_after: float
    load: float
    idle_slices_destroyed: int


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    policy: str
    slots: tuple[Slot, ...]
    tier: Tier
    frag_before: float
    frag_after: float
    reasons: tuple[str, ...] = ()
    candidates: tuple[Candidate, ...] = ()

    @property
    def slot(self) -> Slot:
        return self.slots[0]

    @property
    def score(self) -> float:
        return self.frag_after

    def explain(self, runners_up: int = 0) -> str:
        """One line: where, the fragmentation before and after, the reasons; with ``runners_up``, that many of
        the next-best candidates."""
        s = self.slot
        head = f"{self.job_id} -> {s.gpu_id} {s.profile}@{s.start} ({s.action}, {self.tier})"
        if len(self.slots) > 1:
            head += f" and {len(self.slots) - 1} more GPU(s)"
        text = f"{head} frag {self.frag_before:.3f}->{self.frag_after:.3f}; " + "; ".join(self.reasons)
        if runners_up and self.candidates:
            text += "; runners-up: " + ", ".join(
                f"{c.gpu_id} {c.profile}@{c.start} frag {c.frag_after:.3f}" for c in self.candidates[:runners_up])
        return text


class CannotPlace(msgspec.Struct, frozen=True, kw_only=True):
    """No legal placement now. ``counts`` says how many GPUs were ruled out for each reason."""

    job_id: str
    policy: str
    reasons: tuple[str, ...]
    counts: dict[str, int] = {}
    deferred: bool = False
    """The policy keeps the job waiting by its own rule, not for want of room (a long gang,
    ``shared.policy.placement.long_gangs``): no reservation is planned for it."""

    def explain(self) -> str:
        return f"{self.job_id} cannot be placed: " + "; ".join(self.reasons)


Decision = Placement | CannotPlace
