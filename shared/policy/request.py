"""What a job asks for, and how one request resolves to a profile on each GPU model."""

from __future__ import annotations

import functools
import math
import re
from typing import Annotated, Literal

import msgspec

from shared.errors import RequestError
from shared.mig.geometry import GpuModel, Profile

DemandKind = Literal["mig", "gpus", "shared"]
_PREFIX = "nvidia.com/mig-"
_SHAPE = re.compile(r"^(\d)g(\+me|\.2x)?$")
MAX_GANG = 4096
"""The most GPUs one job may ask for; a gang bigger than every node spans nodes (``shared.policy.placement.gang``)."""
GB_PER_GIB = 1.073741824
"""``memory_gb`` is decimal GB, as in the profile names: 3g.20gb holds 19.62 GiB = 21.1 GB, so it fits 20."""


class Demand(msgspec.Struct, frozen=True, kw_only=True):
    """One of: a MIG profile (by name, by shape such as ``3g``, or by compute slices + memory GiB);
    ``gpus`` whole GPUs (on one node when one node has that many, else across as few nodes as possible); or
    one time-sliced share of a non-MIG GPU."""

    kind: DemandKind = "mig"
    profile: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None
    compute_slices: Annotated[int, msgspec.Meta(ge=1, le=8)] | None = None
    memory_gb: Annotated[float, msgspec.Meta(gt=0, le=4096)] | None = None
    gpus: Annotated[int, msgspec.Meta(ge=1, le=MAX_GANG)] = 1

    def check(self) -> Demand:
        """Raise RequestError when the fields contradict each other; return self otherwise."""
        if self.kind == "mig":
            by_name = self.profile is not None
            by_size = self.compute_slices is not None or self.memory_gb is not None
            if by_name == by_size:
                raise RequestError("a MIG request gives either 'profile' or 'compute_slices' + 'memory_gb'")
            if by_size and (self.compute_slices is None or self.memory_gb is None):
                raise RequestError("a sized MIG request needs both 'compute_slices' and 'memory_gb'")
            if self.gpus != 1:
                raise RequestError("a MIG request takes one instance; use kind 'gpus' for whole GPUs")
        elif self.profile is not None or self.compute_slices is not None:
            raise RequestError(f"a '{self.kind}' request takes no profile or compute_slices")
        elif self.kind == "shared" and self.gpus != 1:
            raise RequestError("a time-sliced request takes one share of one GPU")
        return self

    def label(self) -> str:
        if self.kind == "gpus":
            return f"{self.gpus}xGPU"
        if self.kind == "shared":
            return "shared"
        return self.profile or f"{self.compute_slices}c/{self.memory_gb:g}GB"


def mig(profile: str) -> Demand:
    return Demand(kind="mig", profile=profile)


def sized(compute_slices: int, memory_gb: float) -> Demand:
    return Demand(kind="mig", compute_slices=compute_slices, memory_gb=memory_gb)


def _strip(name: str) -> str:
    return name[len(_PREFIX):] if name.startswith(_PREFIX) else name


def resolve_profile(demand: Demand, model: GpuModel, include_me: bool = False) -> Profile | None:
    """The profile this demand takes on ``model``, or None when the model has none that fits.

    An exact name (``3g.20gb`` or ``nvidia.com/mig-3g.20gb``) matches only models that have it; a shape
    (``3g``) matches that shape on every model; a size maps to the smallest profile with at least that many
    compute slices and decimal GB (fewest memory slices, then fewest compute slices, then least memory),
    ``+me`` only when asked.
    """
    if demand.kind != "mig":
        return None
    if demand.profile is not None:
        name = _strip(demand.profile)
        if model.has_profile(name):
            return model.profile(name)
        if _SHAPE.match(name):
            for p in model.profiles:
                if p.shape == name:
                    return p
        return None
    assert demand.compute_slices is not None and demand.memory_gb is not None
    fitting = [
        p
        for p in model.profiles
        if (include_me or not p.media_extensions)
        and p.compute_slices >= demand.compute_slices
        and p.memory_gib * GB_PER_GIB + 1e-9 >= demand.memory_gb
    ]
    if not fitting:
        return None
    return min(fitting, key=lambda p: (p.memory_slices, p.compute_slices, p.memory_gib, p.name))


def profile_for_fraction(model: GpuModel, fraction: float) -> Profile:
    """The smallest profile whose compute share c/C and memory share m/M both cover ``fraction`` of a GPU
    (the openb ``gpu_milli`` mapping: f <= 1/8 -> 1g, <= 1/4 -> 2g, <= 3/7 -> 3g, <= 1/2 -> 4g, else 7g)."""
    if not 0 < fraction <= 1 or math.isnan(fraction):
        raise RequestError(f"GPU fraction must be in (0, 1], got {fraction}")
    eps = 1e-9
    fitting = [
        p
        for p in model.scoring_profiles()
        if p.shape != "1g.2x"
        and p.compute_slices / model.compute_slices + eps >= fraction
        and p.memory_slices / model.memory_slices + eps >= fraction
    ]
    return min(fitting, key=lambda p: (p.memory_slices, p.compute_slices))


@functools.cache
def full_profile(model: GpuModel) -> Profile:
    """The profile that takes the whole GPU (7g on A100/H100, 4g on A30). Kept per model: the reservation
    pass asks it for every GPU model at each plan."""
    return max(model.scoring_profiles(), key=lambda p: (p.memory_slices, p.compute_slices))
