"""Run parameters of one simulation, as frozen structs (defaults documented in docs/simulator.md)."""

from __future__ import annotations

import msgspec

from shared.policy.retention import RetentionParams

DEFAULT_INTENSITY: dict[str, float] = {
    "inference": 0.3,
    "small-training": 0.6,
    "large-training": 0.9,
    "interactive": 0.15,
}
"""Contention each class puts on the shared paths (PCIe, memory bandwidth), per compute slice share."""


class InterferenceParams(msgspec.Struct, frozen=True, kw_only=True):
    """slowdown_j = 1 + beta * sum over co-runners k on the GPU of intensity_k * compute_k / C (see
    interference.py)."""

    beta: float = 0.5
    intensity: dict[str, float] = msgspec.field(default_factory=lambda: dict(DEFAULT_INTENSITY))
    default_intensity: float = 0.5


class SimConfig(msgspec.Struct, frozen=True, kw_only=True):
    seed: int = 0
    threshold: float = 0.4
    """Lazy/Busy load threshold t handed to the policy and the migration planner."""
    reconfig_latency_s: float = 0.15
    """Per GPU-instance create or destroy; operations on one GPU run one after the other."""
    migration_downtime_s: float = 2.0
    """Work lost to the stop/copy/start of one move (added to the job's remaining work)."""
    checkpoint_s: float = 600.0
    """A moved job also loses its progress since its last checkpoint (every checkpoint_s of run time); 0 =
    none."""
    cooldown_s: float = 120.0
    defrag_interval_s: float = 300.0
    max_moves: int = 4
    patience_s: float = 3600.0
    """Default queue patience: a job waiting longer is rejected."""
    hint_factor: float = 1.0
    """Each job's duration hint is its run time times this (users who overestimate give > 1); 0 = jobs give
    no hints. Reservations let only jobs whose hint ends before a hold's start use held GPUs."""
    default_hint_s: float = 0.0
    """How long a running job without a hint is expected to run, for planning alone (the GPUs a hold waits for
    free at their jobs' expected ends); 0 = such a job's end is unknown and no hold counts on its GPU. The job
    itself still may not use held GPUs."""
    reserve_after_s: float = 1200.0
    """A large job (whole GPUs) that fits on one node and has waited this long without fitting gets a
    reservation (policies that reserve); a gang bigger than every node gets one at once."""
    max_reservations: int = 2
    """Reservations held at once."""
    reserve_slack_s: float = 0.0
    """A job may take a held GPU if its hint ends at most this long after the hold's expected start (relaxed
    backfill); 0 = only if it ends before."""
    unblock_min_left_s: float = 300.0
    """Policies that unblock: a job ending within this is waited for rather than moved, and a reservation
    expected to start within it is preferred to moves."""
    backfill_depth: int = 256
    """How many queued jobs one scheduling pass looks at (bounded so a long queue stays cheap)."""
    retention: RetentionParams = msgspec.field(default_factory=RetentionParams)
    """The node registry's keep-or-destroy rule for idle instances (``shared.policy.retention``)."""
    static_layout: str = "mix"
    """Layout of the static baselines: ``mix`` (sized to the workload, see layouts.py) or a baselines name
    such as
    ``all-balanced``."""
    samples: int = 600
    """Points of the utilisation / fragmentation time series over the run."""
    interference: InterferenceParams = msgspec.field(default_factory=InterferenceParams)
    check_invariants: bool = False
    """Check at every event that no slice is double-booked (tests turn it on; slow)."""
