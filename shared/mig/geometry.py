"""GPU models and their MIG profiles, loaded from a data file and validated.

The tables are data (``data/geometry.json``) so that a new GPU model needs no code change: an operator points
``MIGSCHED_GEOMETRY_FILE`` (or ``load_geometry(path)``) at a JSON or TOML file of the same shape, whose models
replace or extend the built-in ones by name.
"""

from __future__ import annotations

import functools
import os
import tomllib
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import msgspec

from shared.errors import GeometryError, UnknownModelError

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Slices = Annotated[int, msgspec.Meta(ge=1, le=8)]


class Profile(msgspec.Struct, frozen=True, kw_only=True):
    """One MIG GPU-instance profile of one GPU model."""

    name: Name
    shape: Name
    nvml_enum: Annotated[int, msgspec.Meta(ge=0, le=63)]
    profile_id: Annotated[int, msgspec.Meta(ge=0, le=255)]
    compute_slices: Slices
    memory_slices: Slices
    placements: tuple[Annotated[int, msgspec.Meta(ge=0, le=7)], ...]
    max_count: Annotated[int, msgspec.Meta(ge=1, le=8)]
    memory_gib: Annotated[float, msgspec.Meta(gt=0)]
    sm_count: Annotated[int, msgspec.Meta(ge=1)]

    @property
    def media_extensions(self) -> bool:
        return self.shape.endswith("+me")

    def placement_mask(self, start: int) -> int:
        return ((1 << self.memory_slices) - 1) << start


class GpuModel(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    """A MIG-capable GPU model: its slice counts and profile table."""

    name: Name
    aliases: tuple[Name, ...] = ()
    pci_device_ids: tuple[str, ...] = ()
    memory_slices: Annotated[int, msgspec.Meta(ge=1, le=8)]
    compute_slices: Annotated[int, msgspec.Meta(ge=1, le=8)]
    memory_gib: Annotated[float, msgspec.Meta(gt=0)]
    sm_count: Annotated[int, msgspec.Meta(ge=1)]
    verified: bool = False
    note: str = ""
    profiles: tuple[Profile, ...]

    @functools.cached_property
    def _by_name(self) -> dict[str, Profile]:
        return {p.name: p for p in self.profiles}

    def profile(self, name: str) -> Profile:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(p.name for p in self.profiles)
            raise UnknownModelError(f"{self.name} has no profile {name!r}; known: {known}") from None

    def has_profile(self, name: str) -> bool:
        return name in self._by_name

    def profile_by_id(self, profile_id: int) -> Profile:
        for p in self.profiles:
            if p.profile_id == profile_id:
                return p
        raise UnknownModelError(f"{self.name} has no profile id {profile_id}")

    @property
    def full_mask(self) -> int:
        return (1 << self.memory_slices) - 1

    def scoring_profiles(self, include_me: bool = False) -> tuple[Profile, ...]:
        """The profile set M that FragCost averages over (``+me`` variants excluded unless asked)."""
        return tuple(p for p in self.profiles if include_me or not p.media_extensions)


class GeometryFile(msgspec.Struct, kw_only=True):
    schema: int = 1
    source: str = ""
    models: tuple[GpuModel, ...]


def _norm_pci(dev_id: str | int) -> int:
    """Accept ``0x20B0``, ``20b0``, 0x20B0 or NVML's combined ``0x20B010DE`` (device << 16 | vendor)."""
    value = int(dev_id, 16) if isinstance(dev_id, str) else int(dev_id)
    if value > 0xFFFF:
        value >>= 16
    return value


def _norm_name(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def validate_model(model: GpuModel) -> None:
    """Raise GeometryError naming the first inconsistency in a model's table."""
    where = f"GPU model {model.name!r}"
    if model.compute_slices > model.memory_slices:
        raise GeometryError(f"{where}: more compute slices ({model.compute_slices}) than memory slices")
    if not model.profiles:
        raise GeometryError(f"{where}: no profiles")
    seen_names: set[str] = set()
    seen_ids: set[int] = set()
    for p in model.profiles:
        pw = f"{where} profile {p.name!r}"
        if p.name in seen_names:
            raise GeometryError(f"{pw}: duplicate profile name")
        if p.profile_id in seen_ids:
            raise GeometryError(f"{pw}: duplicate NVML profile id {p.profile_id}")
        seen_names.add(p.name)
        seen_ids.add(p.profile_id)
        if p.memory_slices > model.memory_slices or p.compute_slices > model.compute_slices:
            raise GeometryError(f"{pw}: larger than the GPU ({p.compute_slices}c/{p.memory_slices}m)")
        if not p.placements:
            raise GeometryError(f"{pw}: no placements")
        if len(set(p.placements)) != len(p.placements):
            raise GeometryError(f"{pw}: repeated placement start")
        for start in p.placements:
            if start + p.memory_slices > model.memory_slices:
                raise GeometryError(
                    f"{pw}: placement {start}:{p.memory_slices} ends past memory slice {model.memory_slices - 1}"
                )
        if p.memory_gib > model.memory_gib:
            raise GeometryError(f"{pw}: {p.memory_gib} GiB exceeds the GPU's {model.memory_gib} GiB")
        if p.sm_count > model.sm_count:
            raise GeometryError(f"{pw}: {p.sm_count} SMs exceeds the GPU's {model.sm_count}")
    for dev in model.pci_device_ids:
        try:
            _norm_pci(dev)
        except ValueError:
            raise GeometryError(f"{where}: PCI device id {dev!r} is not hexadecimal") from None


class Geometry:
    """A validated set of GPU models with look-ups by name, alias and PCI device id."""

    def __init__(self, models: Iterable[GpuModel]) -> None:
        self._models: dict[str, GpuModel] = {}
        self._names: dict[str, GpuModel] = {}
        self._pci: dict[int, GpuModel] = {}
        for m in models:
            validate_model(m)
            self._models[m.name] = m
        for m in self._models.values():
            for key in (m.name, *m.aliases):
                self._names[_norm_name(key)] = m
            for dev in m.pci_device_ids:
                self._pci[_norm_pci(dev)] = m

    @property
    def models(self) -> tuple[GpuModel, ...]:
        return tuple(self._models.values())

    def model(self, name: str) -> GpuModel:
        found = self._names.get(_norm_name(name))
        if found is None:
            known = ", ".join(self._models)
            raise UnknownModelError(f"unknown GPU model {name!r}; known models: {known}")
        return found

    def by_pci_device_id(self, dev_id: str | int) -> GpuModel:
        try:
            key = _norm_pci(dev_id)
        except ValueError:
            raise UnknownModelError(f"PCI device id {dev_id!r} is not hexadecimal") from None
        found = self._pci.get(key)
        if found is None:
            raise UnknownModelError(f"no GPU model with PCI device id 0x{key:04X}")
        return found

    def merged(self, overrides: Iterable[GpuModel]) -> Geometry:
        """A new geometry where models of the same name are replaced and new ones added."""
        merged = dict(self._models)
        for m in overrides:
            merged[m.name] = m
        return Geometry(merged.values())


def _decode(raw: bytes, fmt: str, origin: str) -> GeometryFile:
    try:
        if fmt == "toml":
            data: Mapping[str, Any] = tomllib.loads(raw.decode())
            return msgspec.convert(data, GeometryFile)
        return msgspec.json.decode(raw, type=GeometryFile)
    except (msgspec.ValidationError, msgspec.DecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise GeometryError(f"{origin}: {exc}") from exc


def _builtin() -> GeometryFile:
    raw = resources.files("shared.mig").joinpath("data/geometry.json").read_bytes()
    return _decode(raw, "json", "built-in geometry.json")


def load_geometry(path: str | Path | None = None) -> Geometry:
    """The built-in tables, overridden by ``path`` (JSON or TOML) when given."""
    base = Geometry(_builtin().models)
    if path is None:
        return base
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise GeometryError(f"cannot read geometry file {p}: {exc.strerror}") from exc
    fmt = "toml" if p.suffix.lower() == ".toml" else "json"
    return base.merged(_decode(raw, fmt, str(p)).models)


@functools.cache
def default_geometry() -> Geometry:
    """The process-wide geometry: built-ins plus ``MIGSCHED_GEOMETRY_FILE`` when set."""
    return load_geometry(os.environ.get("MIGSCHED_GEOMETRY_FILE") or None)
