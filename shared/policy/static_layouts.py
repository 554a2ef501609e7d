"""Fixed MIG layouts per GPU model, after NVIDIA's ``default-mig-parted-config``: what the static baselines
lay out on every GPU before a run and never change."""

from __future__ import annotations

from shared.errors import MigschedError
from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import Layout, fit_mix


class LayoutError(MigschedError, ValueError):
    """A static layout name that does not exist or does not fit the GPU model."""


_BALANCED: dict[int, dict[str, int]] = {8: {"1g": 2, "2g": 1, "3g": 1}, 4: {"1g": 2, "2g": 1}}


def _shape_profile(model: GpuModel, shape_or_name: str) -> Profile | None:
    if model.has_profile(shape_or_name):
        return model.profile(shape_or_name)
    return next((p for p in model.profiles if p.shape == shape_or_name), None)


def static_layout(model: GpuModel, name: str = "all-balanced") -> Layout:
    """The instances of a named layout on ``model``, as ``(profile, start)`` pairs.

    ``all-balanced`` is mig-parted's (1g×2 + 2g + 3g on 8-slice GPUs, 1g×2 + 2g on A30); ``all-<shape>`` or
    ``all-<profile name>`` is as many instances of that profile as fit (all-1g = 7; all-1g.10gb on A100-40GB
    = 4).
    """
    if name == "all-balanced":
        shapes = _BALANCED.get(model.memory_slices)
        if shapes is None:
            raise LayoutError(f"{model.name}: no all-balanced layout for {model.memory_slices} memory slices")
        mix: dict[str, int] = {}
        for shape, n in shapes.items():
            prof = _shape_profile(model, shape)
            if prof is None:
                raise LayoutError(f"{model.name} has no {shape} profile for all-balanced")
            mix[prof.name] = n
        found = fit_mix(model, mix)
        if found is None:
            raise LayoutError(f"all-balanced does not fit {model.name}")
        return found
    if not name.startswith("all-"):
        raise LayoutError(f"unknown layout {name!r}: use all-balanced, all-<shape> or all-<profile>")
    prof = _shape_profile(model, name[4:])
    if prof is None:
        known = ", ".join(sorted({f"all-{p.shape}" for p in model.profiles}))
        raise LayoutError(f"{model.name} has no profile for layout {name!r}; known: all-balanced, {known}")
    for n in range(prof.max_count, 0, -1):
        found = fit_mix(model, {prof.name: n})
        if found is not None:
            return found
    raise LayoutError(f"{prof.name} does not fit {model.name}")  # pragma: no cover - every profile fits empty
