"""The NVML fake's state and driver rules (see ``nvml_fake`` for the pynvml-shaped functions over them).

Handles are real ctypes pointers to pynvml's opaque handle structs, so caller-allocated handle arrays work as
with the real library; each handle's address maps back to the fake object it stands for.
"""

from __future__ import annotations

import ctypes
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

from shared.mig.geometry import GpuModel, Profile, default_geometry
from shared.mig.occupancy import span

_NS = uuid.UUID("0b8f3f0e-7a43-4f7e-9d0c-2f5b7a1e6c44")
# NVML compute-instance profile enum -> compute slices (the ones a GI of that many slices may hold)
_CI_SLICES = {
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE: 6,
}
_FORWARDED = ("NVML_", "NVMLError", "c_nvml", "nvmlPciInfo", "struct_c_nvml")


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def deref(ref: Any, what: str) -> Any:
    """The object behind a ``byref()`` or ``pointer()`` out-parameter, as the C function would see it."""
    obj = getattr(ref, "_obj", None)  # ctypes.byref(...) -> CArgObject
    if obj is not None:
        return obj
    if isinstance(ref, ctypes._Pointer):
        return ref.contents
    # passing a struct by value where C wants a pointer is undefined behaviour on hardware: fail loudly
    raise TypeError(
        f"{what} must be passed with ctypes.byref() or ctypes.pointer(), got {type(ref).__name__}"
    )


@dataclass(frozen=True)
class FakeGpu:
    """Configuration of one fake GPU."""

    model: str | None = "A100-40GB"
    """Geometry model name (None: not a MIG-capable GPU, see ``name``)."""
    name: str | None = None
    pci_device_id: int | None = None
    mig_current: int | None = 1
    """1 enabled, 0 disabled, None: MIG not supported (nvmlDeviceGetMigMode -> NOT_SUPPORTED)."""
    mig_pending: int | None = None
    instances: tuple[tuple[str, int], ...] = ()
    """Pre-existing GIs (profile name, start), each with its full CI."""
    table: GpuModel | None = None
    """Override the profile table the fake reports (to test the difference report)."""


@dataclass(eq=False)
class FakeCi:
    ci_id: int
    profile_enum: int
    slices: int
    handle: Any
    mig_handle: Any
    uuid: str


@dataclass(eq=False)
class FakeGi:
    gi_id: int
    profile: Profile
    start: int
    handle: Any
    cis: dict[int, FakeCi] = field(default_factory=dict)
    pids: set[int] = field(default_factory=set)
    released_at: float | None = None


@dataclass(eq=False)
class FakeDev:
    index: int
    spec: FakeGpu
    model: GpuModel | None
    handle: Any
    uuid: str
    gis: dict[int, FakeGi] = field(default_factory=dict)


class FakeCore:
    """GPUs, GPU instances and compute instances, and the rules the driver applies to them."""

    def __init__(
        self,
        gpus: Sequence[FakeGpu] = (FakeGpu(),),
        *,
        release_window_s: float = 0.0,
        available: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.RLock()
        self._init_count = 0
        self._available = available
        self.release_window_s = release_window_s
        self._clock = clock
        self._keep: list[Any] = []  # keeps ctypes structs behind handles alive
        self._by_addr: dict[int, Any] = {}
        self.calls: list[str] = []
        """Names of every NVML function called, in order (tests assert what was, or was not, done)."""
        geo = default_geometry()
        self._devs: list[FakeDev] = []
        for i, spec in enumerate(gpus):
            model = spec.table or (geo.model(spec.model) if spec.model else None)
            dev = FakeDev(
                i,
                spec,
                model,
                self._new_handle(pynvml.struct_c_nvmlDevice_t, None),
                "GPU-" + str(uuid.uuid5(_NS, f"gpu/{i}/{spec.model}")),
            )
            self._by_addr[self._addr(dev.handle)] = dev
            self._devs.append(dev)
            for prof_name, start in spec.instances:
                assert model is not None
                gi = self._create_gi(dev, model.profile(prof_name), start)
                self._create_ci(gi, self._full_ci_enum(gi))

    def __getattr__(self, name: str) -> Any:
        # constants, error classes and ctypes types are pynvml's own; functions are never forwarded (they
        # would call the real library)
        if name.startswith(_FORWARDED):
            return getattr(pynvml, name)
        raise AttributeError(f"FakeNvml does not implement {name}")

    def _new_handle(self, struct_type: type, owner: Any) -> Any:
        s = struct_type()
        self._keep.append(s)
        handle = ctypes.pointer(s)
        if owner is not None:
            self._by_addr[ctypes.addressof(s)] = owner
        return handle

    @staticmethod
    def _addr(handle: Any) -> int:
        try:
            return ctypes.addressof(handle.contents)
        except (AttributeError, ValueError, TypeError):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None

    def _lookup(self, handle: Any, kind: type) -> Any:
        obj = self._by_addr.get(self._addr(handle))
        if not isinstance(obj, kind):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return obj

    def _enter(self, fn: str) -> None:
        self.calls.append(fn)
        if fn not in ("nvmlInit", "nvmlInitWithFlags") and self._init_count == 0:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _mig_capable_dev(self, handle: Any) -> FakeDev:
        """A GPU that supports MIG, on or off: the driver answers the profile table of either (seen on an H200
        with MIG off); only instance operations need the mode on."""
        dev: FakeDev = self._lookup(handle, FakeDev)
        if dev.spec.mig_current is None or dev.model is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return dev

    def _mig_dev(self, handle: Any) -> FakeDev:
        dev: FakeDev = self._lookup(handle, FakeDev)
        if dev.spec.mig_current != 1 or dev.model is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return dev

    def add_process(self, gpu_index: int, gi_id: int, pid: int) -> None:
        with self._lock:
            self._devs[gpu_index].gis[gi_id].pids.add(pid)

    def end_process(self, gpu_index: int, gi_id: int, pid: int) -> None:
        """The process exits: its GI stays ``IN_USE`` for ``release_window_s`` more."""
        with self._lock:
            gi = self._devs[gpu_index].gis[gi_id]
            gi.pids.discard(pid)
            gi.released_at = self._clock()

    def snapshot(self, gpu_index: int) -> list[tuple[str, int, int]]:
        """(profile name, start, GI id) of every GI on a GPU, sorted by start."""
        with self._lock:
            gis = self._devs[gpu_index].gis.values()
            return sorted((g.profile.name, g.start, g.gi_id) for g in gis)

    def _mig_devices(self, dev: FakeDev) -> list[FakeCi]:
        return [
            ci
            for gi in sorted(dev.gis.values(), key=lambda g: g.gi_id)
            for ci in sorted(gi.cis.values(), key=lambda c: c.ci_id)
        ]

    def _mig_of(self, handle: Any) -> tuple[FakeGi, FakeCi]:
        obj = self._by_addr.get(self._addr(handle))
        if isinstance(obj, FakeCi):
            for dev in self._devs:
                for gi in dev.gis.values():
                    if gi.cis.get(obj.ci_id) is obj:
                        return gi, obj
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # not a MIG device handle

    def _profile_by_enum(self, dev: FakeDev, enum: int) -> Profile:
        if not 0 <= enum < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for p in dev.model.profiles:  # type: ignore[union-attr]
            if p.nvml_enum == enum:
                return p
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _profile_by_id(self, dev: FakeDev, profile_id: int) -> Profile:
        for p in dev.model.profiles:  # type: ignore[union-attr]
            if p.profile_id == profile_id:
                return p
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _create_gi(self, dev: FakeDev, p: Profile, start: int) -> FakeGi:
        assert dev.model is not None
        used = 0
        for gi in dev.gis.values():
            used |= span(gi.profile.memory_slices, gi.start)
        same = sum(1 for gi in dev.gis.values() if gi.profile.profile_id == p.profile_id)
        if used & span(p.memory_slices, start) or same >= p.max_count:
            raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = 0 if p.memory_slices == dev.model.memory_slices else min(set(range(1, 64)) - set(dev.gis))
        gi = FakeGi(gi_id, p, start, None)
        gi.handle = self._new_handle(pynvml.struct_c_nvmlGpuInstance_t, gi)
        dev.gis[gi_id] = gi
        return gi

    def _dev_of(self, gi: FakeGi) -> FakeDev:
        for dev in self._devs:
            if dev.gis.get(gi.gi_id) is gi:
                return dev
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # destroyed: a stale handle

    def _busy(self, gi: FakeGi) -> bool:
        if gi.pids:
            return True
        return gi.released_at is not None and self._clock() - gi.released_at < self.release_window_s

    def _ci_profiles(self, gi: FakeGi) -> dict[int, int]:
        return {e: s for e, s in _CI_SLICES.items() if s <= gi.profile.compute_slices}

    def _full_ci_enum(self, gi: FakeGi) -> int:
        return max(self._ci_profiles(gi).items(), key=lambda kv: kv[1])[0]

    def _create_ci(self, gi: FakeGi, profile_id: int) -> FakeCi:
        slices = self._ci_profiles(gi).get(profile_id)
        if slices is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if sum(c.slices for c in gi.cis.values()) + slices > gi.profile.compute_slices:
            raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = min(set(range(0, 8)) - set(gi.cis))
        dev = self._dev_of(gi)
        ci = FakeCi(
            ci_id,
            profile_id,
            slices,
            None,
            None,
            "MIG-" + str(uuid.uuid5(_NS, f"{dev.uuid}/{gi.gi_id}/{ci_id}/{len(self._keep)}")),
        )
        ci.handle = self._new_handle(pynvml.struct_c_nvmlComputeInstance_t, ci)
        ci.mig_handle = self._new_handle(pynvml.struct_c_nvmlDevice_t, ci)
        gi.cis[ci_id] = ci
        return ci

    def _gi_of(self, ci: FakeCi) -> FakeGi:
        for dev in self._devs:
            for gi in dev.gis.values():
                if gi.cis.get(ci.ci_id) is ci:
                    return gi
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
