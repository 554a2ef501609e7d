"""Read what NVML says about a GPU (synchronous; call from a worker thread) and compare it with the tables.

The profile table is read the driver's way: ``nvmlDeviceGetGpuInstanceProfileInfo(handle, ENUM)`` for every
profile *enum* (``NVML_GPU_INSTANCE_PROFILE_*``), whose ``info.id`` is the profile *ID*; then
``nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, ...)`` by that ID. The two numbers differ
(enum 0 is 1g with ID 19 on an A100), see ``reference/mig-geometry.md``. The NVML view wins for the node; the
differences from the built-in tables are reported, never silently merged.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import msgspec
import pynvml

from shared.errors import GeometryError, UnknownModelError
from shared.mig.geometry import Geometry, GpuModel, Profile, validate_model

_SKIP = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_NOT_FOUND)


class NvmlProfile(msgspec.Struct, frozen=True, kw_only=True):
    enum: int
    profile_id: int
    name: str
    """NVML's name without the ``MIG `` prefix (``1g.5gb``); empty when the driver has only the v1 call."""
    compute_slices: int
    instance_count: int
    sm_count: int
    memory_mb: int
    placements: tuple[tuple[int, int], ...]
    """(start, size) in memory slices, as NVML returns them."""


class NvmlGpu(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    name: str
    uuid: str
    pci_device_id: str
    """``0x20B0`` (the device half of NVML's combined ``pciDeviceId``)."""
    mig_current: int | None
    """1 on, 0 off, None: the GPU does not support MIG."""
    mig_pending: int | None
    profiles: tuple[NvmlProfile, ...] = ()


def text(value: Any) -> str:
    """pynvml returns str from most getters and bytes from struct char arrays."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _profile_info(nvml: Any, handle: Any, enum: int) -> Any:
    """v2 of the call (it carries the profile's name); drivers older than R470 only have v1."""
    try:
        return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)
    except pynvml.NVMLError as exc:
        if exc.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
        return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum, version=1)


def read_profiles(nvml: Any, handle: Any) -> tuple[NvmlProfile, ...]:
    found: dict[int, NvmlProfile] = {}
    for enum in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = _profile_info(nvml, handle, enum)
        except pynvml.NVMLError as exc:
            if exc.value in _SKIP:
                continue  # this GPU/driver has no such profile
            raise
        if info.id in found:
            continue
        count = ctypes.c_uint(0)
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, None, ctypes.byref(count))
        placements = (pynvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, placements, ctypes.byref(count))
        name = text(getattr(info, "name", b"")).removeprefix("MIG ").strip()
        found[info.id] = NvmlProfile(
            enum=enum,
            profile_id=int(info.id),
            name=name,
            compute_slices=int(info.sliceCount),
            instance_count=int(info.instanceCount),
            sm_count=int(info.multiprocessorCount),
            memory_mb=int(info.memorySizeMB),
            placements=tuple((int(placements[i].start), int(placements[i].size)) for i in range(count.value)),
        )
    return tuple(found.values())


def read_gpu(nvml: Any, index: int) -> NvmlGpu:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    try:
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError as exc:
        if exc.value != pynvml.NVML_ERROR_NOT_SUPPORTED:
            raise
        current = pending = None
    profiles = read_profiles(nvml, handle) if current == 1 else ()
    return NvmlGpu(
        index=index,
        name=text(nvml.nvmlDeviceGetName(handle)),
        uuid=text(nvml.nvmlDeviceGetUUID(handle)),
        pci_device_id=f"0x{(int(pci.pciDeviceId) >> 16) & 0xFFFF:04X}",
        mig_current=current,
        mig_pending=pending,
        profiles=profiles,
    )


def match_builtin(gpu: NvmlGpu, geometry: Geometry) -> GpuModel | None:
    """The built-in model for a GPU: by PCI device id first (exact), then by marketing name."""
    try:
        return geometry.by_pci_device_id(gpu.pci_device_id)
    except UnknownModelError:
        pass
    for candidate in (gpu.name, gpu.name.removeprefix("NVIDIA ").strip()):
        try:
            return geometry.model(candidate)
        except UnknownModelError:
            continue
    return None


def _name(p: NvmlProfile, builtin: Profile | None, taken: set[str]) -> str:
    """NVML's name; without one (v1 call), the table's name for that ID, else a made-up unique one."""
    name = p.name or (builtin.name if builtin else f"{p.compute_slices}g.{round(p.memory_mb / 1024)}gb")
    if name in taken:
        name = f"{name}-id{p.profile_id}"
    taken.add(name)
    return name


def _shape(p: NvmlProfile, builtin: Profile | None) -> str:
    if builtin is not None:
        return builtin.shape
    return f"{p.compute_slices}g" + ("+me" if p.name.endswith("+me") else "")


def build_model(gpu: NvmlGpu, builtin: GpuModel | None, *, node: str = "") -> GpuModel:
    """A node-local GpuModel from NVML's answers (shapes borrowed from the table where IDs match)."""
    if not gpu.profiles:
        raise GeometryError(f"GPU {gpu.index} ({gpu.name}) reported no MIG profiles")
    by_id = {p.profile_id: p for p in builtin.profiles} if builtin else {}
    profiles = []
    taken: set[str] = set()
    for p in gpu.profiles:
        if not p.placements:
            continue
        ref = by_id.get(p.profile_id)
        profiles.append(
            Profile(
                name=_name(p, ref, taken),
                shape=_shape(p, ref),
                nvml_enum=p.enum,
                profile_id=p.profile_id,
                compute_slices=p.compute_slices,
                memory_slices=p.placements[0][1],
                placements=tuple(sorted(s for s, _ in p.placements)),
                max_count=p.instance_count,
                memory_gib=round(p.memory_mb / 1024, 2),
                sm_count=p.sm_count,
            )
        )
    # the table's order where it knows the profile (stable output for operators), NVML-only ones after
    order = {p.profile_id: i for i, p in enumerate(builtin.profiles)} if builtin else {}
    profiles.sort(key=lambda p: (order.get(p.profile_id, len(order)), p.memory_slices, p.compute_slices))
    memory_slices = max(s + n for p in gpu.profiles for s, n in p.placements)
    model = GpuModel(
        name=builtin.name if builtin else gpu.name[:64],
        aliases=(gpu.name[:64],),
        pci_device_ids=(gpu.pci_device_id,),
        memory_slices=memory_slices,
        compute_slices=max(p.compute_slices for p in profiles),
        memory_gib=max(([builtin.memory_gib] if builtin else []) + [p.memory_gib for p in profiles]),
        sm_count=max(([builtin.sm_count] if builtin else []) + [p.sm_count for p in profiles]),
        verified=True,
        note=f"read from NVML{' on ' + node if node else ''} (GPU {gpu.index}, {gpu.uuid})",
        profiles=tuple(profiles),
    )
    validate_model(model)
    return model


def compare(gpu: NvmlGpu, builtin: GpuModel | None) -> list[str]:
    """Differences between NVML's table and the built-in one, one operator-readable line each."""
    if builtin is None:
        return [
            f"no built-in table matches {gpu.name!r} (PCI {gpu.pci_device_id}): the NVML table is used as is"
        ]
    out: list[str] = []
    mine = {p.profile_id: p for p in builtin.profiles}
    theirs = {p.profile_id: p for p in gpu.profiles}
    for pid, p in theirs.items():
        b = mine.get(pid)
        if b is None:
            out.append(
                f"profile {p.name or '?'} (ID {pid}, enum {p.enum}) is offered by NVML but not in the table"
            )
            continue
        where = f"profile {b.name} (ID {pid})"
        starts = tuple(sorted(s for s, _ in p.placements))
        sizes = {n for _, n in p.placements}
        checks = [
            ("name", b.name, p.name or b.name),  # no name from a v1-only driver: nothing to compare
            ("enum", b.nvml_enum, p.enum),
            ("placements", b.placements, starts),
            ("size in memory slices", {b.memory_slices}, sizes),
            ("compute slices", b.compute_slices, p.compute_slices),
            ("max count", b.max_count, p.instance_count),
            ("SM count", b.sm_count, p.sm_count),
        ]
        for what, table, nvml in checks:
            if table != nvml:
                out.append(f"{where}: {what} table={_fmt(table)} NVML={_fmt(nvml)}")
        nvml_gib = p.memory_mb / 1024
        if abs(nvml_gib - b.memory_gib) > 0.05 * b.memory_gib:
            out.append(f"{where}: memory table={b.memory_gib} GiB NVML={nvml_gib:.2f} GiB")
    for pid, b in mine.items():
        if pid not in theirs:
            out.append(f"profile {b.name} (ID {pid}) is in the table but this GPU/driver does not offer it")
    return out


def _fmt(value: object) -> str:
    if isinstance(value, (set, frozenset)):
        return "/".join(str(v) for v in sorted(value))
    if isinstance(value, tuple):
        return "{" + ",".join(str(v) for v in value) + "}"
    return str(value)


@dataclass
class NodeGpu:
    """One GPU of this node as the NVML backend holds it: its index, NVML handle, what NVML reports of it, the
    built-in model it matches and the table it is driven by."""

    index: int
    handle: Any
    raw: NvmlGpu
    builtin: GpuModel | None
    model: GpuModel | None
    """The node-local table read from NVML (None when the GPU is not in MIG mode)."""
    differences: list[str]
