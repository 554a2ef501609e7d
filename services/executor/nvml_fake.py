"""A faithful in-memory fake of the pynvml subset the NVML backend and ``gpu-check`` use.

Same function names and signatures as ``pynvml``, same return shapes (the real ctypes structs and opaque
handle pointers, so caller-allocated arrays and ``byref`` out-parameters work as on hardware), the same
``pynvml.NVMLError`` subclasses and codes. The driver's rules come from the geometry tables: a GI only at a
legal start of its profile with the profile's size, no memory-slice overlap, the profile's max count, CI
capacity inside its GI, teardown CI before GI, ``IN_USE`` while a GI has processes or within a configurable
"just released" window after its last process ended. GPUs may be MIG-enabled, MIG-pending, MIG-disabled or not
MIG-capable, and may start with pre-existing instances.

Use it as the ``nvml`` module: ``NvmlBackend(nvml=FakeNvml([FakeGpu("A100-40GB")]))``.
"""

from __future__ import annotations

from typing import Any

import pynvml

from services.executor.nvml_fake_core import FakeCi, FakeCore, FakeDev, FakeGi, FakeGpu, deref, nvml_error

__all__ = ["FakeGpu", "FakeNvml", "from_spec"]


class FakeNvml(FakeCore):
    """Use as the ``pynvml`` module. Test helpers: add_process, end_process, calls, snapshot."""

    def nvmlInit(self) -> None:
        with self._lock:
            self.calls.append("nvmlInit")
            if not self._available:
                raise nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
            self._init_count += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            self._enter("nvmlShutdown")
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        with self._lock:
            self._enter("nvmlSystemGetDriverVersion")
            return "550.54.15-fake"

    def nvmlDeviceGetCount(self) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetCount")
            return len(self._devs)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        with self._lock:
            self._enter("nvmlDeviceGetHandleByIndex")
            if not 0 <= index < len(self._devs):
                raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return self._devs[index].handle

    def nvmlDeviceGetName(self, handle: Any) -> str:
        with self._lock:
            self._enter("nvmlDeviceGetName")
            obj = self._by_addr.get(self._addr(handle))
            if isinstance(obj, FakeCi):
                return "NVIDIA MIG device"
            dev = self._lookup(handle, FakeDev)
            if dev.spec.name:
                return dev.spec.name
            assert dev.model is not None
            named = [a for a in dev.model.aliases if a.startswith("NVIDIA ")]
            return named[0] if named else f"NVIDIA {dev.model.name}"

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        with self._lock:
            self._enter("nvmlDeviceGetUUID")
            obj = self._by_addr.get(self._addr(handle))
            if isinstance(obj, FakeCi):
                return obj.uuid
            return str(self._lookup(handle, FakeDev).uuid)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        with self._lock:
            self._enter("nvmlDeviceGetPciInfo")
            dev = self._lookup(handle, FakeDev)
            info = pynvml.nvmlPciInfo_t()
            dev_id = dev.spec.pci_device_id
            if dev_id is None:
                dev_id = (
                    int(dev.model.pci_device_ids[0], 16) if dev.model and dev.model.pci_device_ids else 0x1EB8
                )
            info.pciDeviceId = (dev_id << 16) | 0x10DE
            info.bus = 0x10 + dev.index
            info.busId = f"00000000:{0x10 + dev.index:02X}:00.0".encode()
            return info

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        with self._lock:
            self._enter("nvmlDeviceGetMigMode")
            dev = self._lookup(device, FakeDev)
            if dev.spec.mig_current is None:
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            pending = dev.spec.mig_pending if dev.spec.mig_pending is not None else dev.spec.mig_current
            return [dev.spec.mig_current, pending]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetMaxMigDeviceCount")
            dev = self._lookup(device, FakeDev)
            return dev.model.compute_slices if dev.model and dev.spec.mig_current == 1 else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        with self._lock:
            self._enter("nvmlDeviceGetMigDeviceHandleByIndex")
            dev = self._mig_dev(device)
            if not 0 <= index < dev.model.compute_slices:  # type: ignore[union-attr]
                raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            migs = self._mig_devices(dev)
            if index >= len(migs):
                raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
            return migs[index].mig_handle

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetGpuInstanceId")
            return self._mig_of(device)[0].gi_id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetComputeInstanceId")
            return self._mig_of(device)[1].ci_id

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        with self._lock:
            self._enter("nvmlDeviceGetComputeRunningProcesses")
            obj = self._by_addr.get(self._addr(handle))
            if isinstance(obj, FakeCi):
                gi, _ci = self._mig_of(handle)
                gis = [gi]
            else:
                gis = list(self._lookup(handle, FakeDev).gis.values())
            procs = []
            for gi in gis:
                for pid in sorted(gi.pids):
                    p = pynvml.c_nvmlProcessInfo_v2_t(
                        pid=pid, usedGpuMemory=0, gpuInstanceId=gi.gi_id, computeInstanceId=0
                    )
                    procs.append(pynvml.nvmlStructToFriendlyObject(p))
            return procs

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int, version: int = 2) -> Any:
        with self._lock:
            self._enter("nvmlDeviceGetGpuInstanceProfileInfo")
            dev = self._mig_capable_dev(device)
            p = self._profile_by_enum(dev, profile)
            if version == 2:
                info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
                info.name = f"MIG {p.name}".encode()
            elif version == 1:
                info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
            else:
                raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            info.id = p.profile_id
            info.isP2pSupported = 0
            info.sliceCount = p.compute_slices
            info.instanceCount = p.max_count
            info.multiprocessorCount = p.sm_count
            info.copyEngineCount = p.compute_slices
            info.decoderCount = p.compute_slices // 2
            info.jpegCount = 1 if p.media_extensions or p.compute_slices == 7 else 0
            info.ofaCount = info.jpegCount
            info.memorySizeMB = round(p.memory_gib * 1024)
            return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetGpuInstancePossiblePlacements")
            dev = self._mig_capable_dev(device)
            p = self._profile_by_id(dev, profileId)
            count = deref(countRef, "countRef")
            if placementsRef is None:
                count.value = len(p.placements)
                return pynvml.NVML_SUCCESS
            if count.value < len(p.placements) or len(placementsRef) < len(p.placements):
                count.value = len(p.placements)
                raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, start in enumerate(p.placements):
                placementsRef[i].start = start
                placementsRef[i].size = p.memory_slices
            count.value = len(p.placements)
            return pynvml.NVML_SUCCESS

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: Any, profileId: int, placement: Any) -> Any:
        with self._lock:
            self._enter("nvmlDeviceCreateGpuInstanceWithPlacement")
            dev = self._mig_dev(device)
            p = self._profile_by_id(dev, profileId)
            pl = deref(placement, "placement")
            if pl.start not in p.placements or pl.size != p.memory_slices:
                raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return self._create_gi(dev, p, pl.start).handle

    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetGpuInstances")
            dev = self._mig_dev(device)
            self._profile_by_id(dev, profileId)
            count = deref(countRef, "countRef")
            found = sorted(
                (g for g in dev.gis.values() if g.profile.profile_id == profileId), key=lambda g: g.gi_id
            )
            if gpuInstancesRef is None or len(gpuInstancesRef) < len(found):
                count.value = len(found)
                raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, gi in enumerate(found):
                gpuInstancesRef[i] = gi.handle
            count.value = len(found)
            return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        with self._lock:
            self._enter("nvmlDeviceGetGpuInstanceById")
            dev = self._mig_dev(device)
            if gpuInstanceId not in dev.gis:
                raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
            return dev.gis[gpuInstanceId].handle

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        with self._lock:
            self._enter("nvmlGpuInstanceGetInfo")
            gi: FakeGi = self._lookup(gpuInstance, FakeGi)
            dev = self._dev_of(gi)
            info = pynvml.c_nvmlGpuInstanceInfo_t()
            info.device = dev.handle
            info.id = gi.gi_id
            info.profileId = gi.profile.profile_id
            info.placement.start = gi.start
            info.placement.size = gi.profile.memory_slices
            return info

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        with self._lock:
            self._enter("nvmlGpuInstanceDestroy")
            gi: FakeGi = self._lookup(gpuInstance, FakeGi)
            dev = self._dev_of(gi)
            if gi.cis or self._busy(gi):
                raise nvml_error(pynvml.NVML_ERROR_IN_USE)
            del dev.gis[gi.gi_id]
            del self._by_addr[self._addr(gi.handle)]
            return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        with self._lock:
            self._enter("nvmlGpuInstanceGetComputeInstanceProfileInfo")
            gi: FakeGi = self._lookup(device, FakeGi)
            self._dev_of(gi)
            if engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
                raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if not 0 <= profile < pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
                raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            slices = self._ci_profiles(gi).get(profile)
            if slices is None:
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if version == 2:
                info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
                info.name = f"MIG {slices}c.{gi.profile.name}".encode()
            elif version == 1:
                info = pynvml.c_nvmlComputeInstanceProfileInfo_t()
            else:
                raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            info.id = profile  # CI profile ids equal their enums on every driver seen so far
            info.sliceCount = slices
            info.instanceCount = gi.profile.compute_slices // slices
            info.multiprocessorCount = gi.profile.sm_count * slices // gi.profile.compute_slices
            return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        with self._lock:
            self._enter("nvmlGpuInstanceCreateComputeInstance")
            gi: FakeGi = self._lookup(gpuInstance, FakeGi)
            return self._create_ci(gi, profileId).handle

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        with self._lock:
            self._enter("nvmlGpuInstanceGetComputeInstances")
            gi: FakeGi = self._lookup(gpuInstance, FakeGi)
            self._dev_of(gi)
            count = deref(countRef, "countRef")
            found = sorted((c for c in gi.cis.values() if c.profile_enum == profileId), key=lambda c: c.ci_id)
            if computeInstancesRef is None or len(computeInstancesRef) < len(found):
                count.value = len(found)
                raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, ci in enumerate(found):
                computeInstancesRef[i] = ci.handle
            count.value = len(found)
            return pynvml.NVML_SUCCESS

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any:
        with self._lock:
            self._enter("nvmlComputeInstanceGetInfo")
            ci: FakeCi = self._lookup(computeInstance, FakeCi)
            gi = self._gi_of(ci)
            info = pynvml.c_nvmlComputeInstanceInfo_t()
            info.device = self._dev_of(gi).handle
            info.gpuInstance = gi.handle
            info.id = ci.ci_id
            info.profileId = ci.profile_enum
            info.placement.start = 0
            info.placement.size = ci.slices
            return info

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        with self._lock:
            self._enter("nvmlComputeInstanceDestroy")
            ci: FakeCi = self._lookup(computeInstance, FakeCi)
            gi = self._gi_of(ci)
            if self._busy(gi):
                raise nvml_error(pynvml.NVML_ERROR_IN_USE)
            del gi.cis[ci.ci_id]
            del self._by_addr[self._addr(ci.handle)]
            del self._by_addr[self._addr(ci.mig_handle)]
            return pynvml.NVML_SUCCESS


def from_spec(spec: str, **options: Any) -> FakeNvml:
    """A fake from a one-line description, for ``MIGSCHED_NVML_FAKE`` / ``gpu-check --fake``.

    ``unavailable`` (no driver); otherwise comma-separated GPUs
    ``MODEL[:off|:pending|:nomig][/PROFILE@START...]``,
    e.g. ``A100-40GB/3g.20gb@4,H100-80GB:off,Tesla T4:nomig``.
    """
    if spec.strip() == "unavailable":
        return FakeNvml([], available=False, **options)
    gpus = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        head, *insts = item.split("/")
        model, _, mode = head.partition(":")
        instances = tuple((p, int(s)) for p, s in (i.rsplit("@", 1) for i in insts))
        if mode == "nomig":
            gpus.append(FakeGpu(model=None, name=model, mig_current=None))
        elif mode in ("off", "pending"):
            gpus.append(FakeGpu(model=model, mig_current=0, mig_pending=1 if mode == "pending" else 0))
        else:
            gpus.append(FakeGpu(model=model, instances=instances))
    return FakeNvml(gpus, **options)
