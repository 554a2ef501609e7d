"""Synchronous MIG operations over an NVML module (pynvml or the fake). Run them in a worker thread.

Callers pass caller-allocated ctypes arrays and ``byref`` counts exactly as the C API wants them; every
function raises ``pynvml.NVMLError`` unchanged (the backend translates it with the action it was doing).
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

import msgspec
import pynvml

from shared.mig.geometry import GpuModel

_ABSENT = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_NOT_FOUND)


class RawInstance(msgspec.Struct, frozen=True, kw_only=True):
    gi_id: int
    profile_id: int
    start: int
    size: int
    ci_ids: tuple[int, ...]
    uuid: str


def mig_uuids(nvml: Any, device: Any) -> dict[tuple[int, int], str]:
    """(GI id, CI id) -> MIG device UUID, for every MIG device of a GPU."""
    out: dict[tuple[int, int], str] = {}
    for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(device)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, index)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_NOT_FOUND:
                continue  # no MIG device at this index
            raise
        gi = nvml.nvmlDeviceGetGpuInstanceId(mig)
        ci = nvml.nvmlDeviceGetComputeInstanceId(mig)
        uuid = nvml.nvmlDeviceGetUUID(mig)
        out[(int(gi), int(ci))] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    return out


def compute_instances(nvml: Any, gi: Any) -> list[tuple[int, Any]]:
    """(CI id, handle) of every compute instance in a GPU instance, whatever its CI profile."""
    found: list[tuple[int, Any]] = []
    for enum in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, enum, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
        except pynvml.NVMLError as exc:
            if exc.value in _ABSENT:
                continue
            raise
        size = max(int(info.instanceCount), 1)
        handles = (pynvml.c_nvmlComputeInstance_t * size)()
        count = ctypes.c_uint(0)
        nvml.nvmlGpuInstanceGetComputeInstances(gi, info.id, handles, ctypes.byref(count))
        for i in range(count.value):
            ci_info = nvml.nvmlComputeInstanceGetInfo(handles[i])
            if all(ci_info.id != cid for cid, _ in found):
                found.append((int(ci_info.id), handles[i]))
    return sorted(found, key=lambda x: x[0])


def gpu_instances(nvml: Any, device: Any, model: GpuModel) -> list[tuple[Any, Any]]:
    """(handle, nvmlGpuInstanceInfo) of every GI on a GPU, over every profile ID of its (NVML-read) model."""
    out: list[tuple[Any, Any]] = []
    for profile in model.profiles:
        handles = (pynvml.c_nvmlGpuInstance_t * max(profile.max_count, 1))()
        count = ctypes.c_uint(0)
        nvml.nvmlDeviceGetGpuInstances(device, profile.profile_id, handles, ctypes.byref(count))
        for i in range(count.value):
            out.append((handles[i], nvml.nvmlGpuInstanceGetInfo(handles[i])))
    return out


def list_instances(nvml: Any, device: Any, model: GpuModel) -> list[RawInstance]:
    uuids = mig_uuids(nvml, device)
    out = []
    for handle, info in gpu_instances(nvml, device, model):
        ci_ids = tuple(cid for cid, _ in compute_instances(nvml, handle))
        gi_id = int(info.id)
        out.append(
            RawInstance(
                gi_id=gi_id,
                profile_id=int(info.profileId),
                start=int(info.placement.start),
                size=int(info.placement.size),
                ci_ids=ci_ids,
                uuid=uuids.get((gi_id, ci_ids[0]), "") if ci_ids else "",
            )
        )
    return sorted(out, key=lambda r: (r.start, r.gi_id))


def full_ci_profile(nvml: Any, gi: Any) -> int:
    """The CI profile *ID* of the largest compute instance the GI can hold (the usual ``-C`` CI)."""
    best: tuple[int, int] | None = None  # (slices, id)
    for enum in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, enum, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
        except pynvml.NVMLError as exc:
            if exc.value in _ABSENT:
                continue
            raise
        if best is None or int(info.sliceCount) > best[0]:
            best = (int(info.sliceCount), int(info.id))
    if best is None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return best[1]


def create(nvml: Any, device: Any, profile_id: int, start: int, size: int) -> RawInstance:
    """GI at exactly (start, size) plus its full CI; the GI is rolled back if the CI cannot be made."""
    placement = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
    gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, profile_id, ctypes.byref(placement))
    try:
        ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, full_ci_profile(nvml, gi))
        ci_id = int(nvml.nvmlComputeInstanceGetInfo(ci).id)
    except pynvml.NVMLError:
        # if this fails too, the next listing shows a GI without a CI (uuid ""), which nobody will use
        with contextlib.suppress(pynvml.NVMLError):
            nvml.nvmlGpuInstanceDestroy(gi)
        raise
    info = nvml.nvmlGpuInstanceGetInfo(gi)
    gi_id = int(info.id)
    return RawInstance(
        gi_id=gi_id,
        profile_id=int(info.profileId),
        start=int(info.placement.start),
        size=int(info.placement.size),
        ci_ids=(ci_id,),
        uuid=mig_uuids(nvml, device).get((gi_id, ci_id), ""),
    )


def destroy(nvml: Any, device: Any, gi_id: int) -> bool:
    """Destroy every CI of the GI, then the GI. False when the GI does not exist (already destroyed)."""
    try:
        gi = nvml.nvmlDeviceGetGpuInstanceById(device, gi_id)
    except pynvml.NVMLError as exc:
        if exc.value in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
            return False
        raise
    for _, ci in compute_instances(nvml, gi):
        nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(gi)
    return True
