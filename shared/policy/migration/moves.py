"""The migration planner's inputs and outputs: its parameters and the moves it plans."""

from __future__ import annotations

from typing import Literal

import msgspec

from shared.mig.geometry import Profile
from shared.policy.snapshot import InstanceView

IntraMove = tuple[tuple[int, int, int, int, str], InstanceView, Profile, int]
"""(key: change, idle slices destroyed, source start, -destination start, job; instance; profile; start)."""
SourceJob = tuple[tuple[int, int, int, int], str, InstanceView]
"""(key: source change, -source load, source position, start; source GPU id; instance)."""


class MigrationParams(msgspec.Struct, frozen=True, kw_only=True):
    threshold: float = 0.4
    """Lazy/Busy threshold on load (used / total compute slices), the balancer's ``t``."""
    cooldown_s: float = 120.0
    """A job moved less than this long ago is not moved again."""
    max_moves: int = 4
    """Most moves in one plan (one call)."""
    intra: bool = True
    inter: bool = True
    pull_into_empty: bool = True
    consolidate: bool = False
    """After an exit leaves a Lazy GPU with a few jobs, move all of them onto GPUs that already run jobs so it
    becomes empty for a whole-GPU job (``shared.policy.migration.consolidate``), before any pull into it."""
    """Whether an inter move may target a GPU with no job. The seeds pull into any Lazy GPU, which spreads
    jobs onto empty GPUs and costs the whole-GPU jobs that dominate real traces their room; False pulls only
    into partly used Lazy GPUs (filling their holes) and keeps empty GPUs empty."""


class Move(msgspec.Struct, frozen=True, kw_only=True):
    """One planned job move. ``expected_change`` < 0 means FragCost drops (intra: the GPU's; inter: the
    source's). The source instance is released after the hand-over; ``destroy`` lists the idle instances on
    the destination that are in the way and must be destroyed first."""

    job_id: str
    kind: Literal["intra", "inter"]
    src_gpu: str
    src_instance: str
    src_profile: str
    src_start: int
    dst_gpu: str
    dst_profile: str
    dst_start: int
    dst_size: int
    destroy: tuple[str, ...]
    frag_src_before: float
    frag_src_after: float
    frag_dst_before: float
    frag_dst_after: float
    expected_change: float
    reason: str
