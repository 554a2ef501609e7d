"""The NVML fake is only useful if it behaves like pynvml: same signatures, shapes, codes and driver rules."""

from __future__ import annotations

import ctypes
import inspect

import pynvml
import pytest

from services.executor.nvml_discovery import read_profiles
from services.executor.nvml_fake import FakeGpu, FakeNvml, from_spec

pytestmark = pytest.mark.unit


@pytest.fixture
def nvml() -> FakeNvml:
    fake = FakeNvml([FakeGpu("A100-40GB"), FakeGpu("H100-80GB", mig_current=0)])
    fake.nvmlInit()
    return fake


def _params(fn: object) -> list[tuple[str, object]]:
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    return [(p.name, p.default) for p in sig.parameters.values() if p.name != "self"]


def test_every_fake_function_has_the_signature_of_the_real_pynvml_function() -> None:
    names = [n for n in dir(FakeNvml) if n.startswith("nvml")]
    assert len(names) >= 25
    for name in names:
        assert hasattr(pynvml, name), f"pynvml has no {name}"
        assert _params(getattr(FakeNvml, name)) == _params(getattr(pynvml, name)), name


def test_constants_and_types_are_pynvmls_own_but_functions_are_never_forwarded(nvml: FakeNvml) -> None:
    assert nvml.NVML_ERROR_IN_USE == pynvml.NVML_ERROR_IN_USE
    assert nvml.c_nvmlGpuInstancePlacement_t is pynvml.c_nvmlGpuInstancePlacement_t
    with pytest.raises(AttributeError):
        nvml.nvmlDeviceGetPowerUsage  # noqa: B018 - not implemented, must not reach the real library


def test_calls_before_init_fail_as_uninitialised() -> None:
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        FakeNvml().nvmlDeviceGetCount()


def test_profile_info_is_asked_by_enum_and_answers_with_the_profile_id(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    assert isinstance(info, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
    assert (info.id, info.sliceCount, info.instanceCount, info.memorySizeMB) == (19, 1, 7, 4864)
    assert info.name == "MIG 1g.5gb"  # pynvml's printable structs hand char arrays back as str
    with pytest.raises(pynvml.NVMLError_NotSupported):  # 6_SLICE: no such profile on an A100
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)


def test_placements_are_asked_by_profile_id_so_mixing_up_enum_and_id_gives_the_wrong_profile(
    nvml: FakeNvml,
) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, 19, None, ctypes.byref(count))
    assert count.value == 7
    arr = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, 19, arr, ctypes.byref(count))
    assert [(p.start, p.size) for p in arr] == [(s, 1) for s in range(7)]
    # enum 0 (1g) used as an ID is profile ID 0: the whole-GPU 7g profile
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, 0, arr, ctypes.byref(count))
    assert (count.value, arr[0].start, arr[0].size) == (1, 0, 8)
    small = (pynvml.c_nvmlGpuInstancePlacement_t * 2)()
    count.value = 2
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, 19, small, ctypes.byref(count))


def test_discovery_reads_the_table_the_driver_way(nvml: FakeNvml) -> None:
    profiles = {p.name: p for p in read_profiles(nvml, nvml.nvmlDeviceGetHandleByIndex(0))}
    assert (profiles["1g.5gb"].enum, profiles["1g.5gb"].profile_id) == (0, 19)
    assert profiles["3g.20gb"].placements == ((0, 4), (4, 4))
    assert profiles["1g.10gb"].enum == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2


def test_create_needs_a_placement_by_reference_and_obeys_overlap_and_max_count(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    pl = pynvml.c_nvmlGpuInstancePlacement_t(4, 4)
    with pytest.raises(TypeError, match="byref"):
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, pl)
    gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, ctypes.byref(pl))
    info = nvml.nvmlGpuInstanceGetInfo(gi)
    assert (info.profileId, info.placement.start, info.placement.size) == (9, 4, 4)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            h, 14, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(4, 2))
        )
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # 2g cannot start at 1
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            h, 14, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(1, 2))
        )
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # wrong size for the profile
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            h, 14, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(0, 1))
        )
    nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
        h, 20, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(0, 1))
    )
    with pytest.raises(pynvml.NVMLError_InsufficientResources):  # 1g+me: max one
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            h, 20, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(1, 1))
        )


def test_teardown_is_compute_instance_first_and_the_mig_device_has_a_uuid(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
        h, 14, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(2, 2))
    )
    ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    gi_id = nvml.nvmlGpuInstanceGetInfo(gi).id
    assert nvml.nvmlDeviceGetGpuInstanceId(mig) == gi_id
    assert nvml.nvmlDeviceGetComputeInstanceId(mig) == nvml.nvmlComputeInstanceGetInfo(ci).id
    assert nvml.nvmlDeviceGetUUID(mig).startswith("MIG-")
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlGpuInstanceDestroy(gi)
    nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # a stale handle
        nvml.nvmlGpuInstanceGetInfo(gi)


def test_listing_instances_uses_caller_sized_arrays(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    for start in (0, 3, 6):
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            h, 19, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(start, 1))
        )
    count = ctypes.c_uint(0)
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        nvml.nvmlDeviceGetGpuInstances(h, 19, (pynvml.c_nvmlGpuInstance_t * 2)(), ctypes.byref(count))
    arr = (pynvml.c_nvmlGpuInstance_t * 7)()
    nvml.nvmlDeviceGetGpuInstances(h, 19, arr, ctypes.byref(count))
    starts = sorted(nvml.nvmlGpuInstanceGetInfo(arr[i]).placement.start for i in range(count.value))
    assert starts == [0, 3, 6]


def test_a_gpu_with_mig_off_offers_its_table_but_refuses_instance_calls(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 0]
    assert nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, 0).id == 19  # as the driver answers on an H200 with MIG off
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuInstances(h, 19, (ctypes.c_void_p * 7)(), ctypes.byref(ctypes.c_uint(0)))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            h, 19, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(0, 1))
        )


def test_a_gi_with_processes_or_just_released_is_in_use() -> None:
    now = [0.0]
    fake = FakeNvml(
        [FakeGpu("A30-24GB", instances=(("2g.12gb", 2),))], release_window_s=0.5, clock=lambda: now[0]
    )
    fake.nvmlInit()
    gi = fake.nvmlDeviceGetGpuInstanceById(fake.nvmlDeviceGetHandleByIndex(0), 1)
    ci_arr = (pynvml.c_nvmlComputeInstance_t * 1)()
    count = ctypes.c_uint(0)
    fake.nvmlGpuInstanceGetComputeInstances(
        gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, ci_arr, ctypes.byref(count)
    )
    fake.add_process(0, 1, 99)
    assert [p.pid for p in fake.nvmlDeviceGetComputeRunningProcesses(fake.nvmlDeviceGetHandleByIndex(0))] == [
        99
    ]
    with pytest.raises(pynvml.NVMLError_InUse):
        fake.nvmlComputeInstanceDestroy(ci_arr[0])
    fake.end_process(0, 1, 99)
    now[0] = 0.4
    with pytest.raises(pynvml.NVMLError_InUse):
        fake.nvmlComputeInstanceDestroy(ci_arr[0])
    now[0] = 0.6
    fake.nvmlComputeInstanceDestroy(ci_arr[0])
    fake.nvmlGpuInstanceDestroy(gi)
    assert fake.snapshot(0) == []


def test_a_one_line_spec_describes_a_node() -> None:
    fake = from_spec("A100-40GB/3g.20gb@4/1g.5gb@0,H100-80GB:pending,Tesla T4:nomig")
    fake.nvmlInit()
    assert fake.nvmlDeviceGetCount() == 3
    assert fake.snapshot(0) == [("1g.5gb", 0, 2), ("3g.20gb", 4, 1)]
    assert fake.nvmlDeviceGetMigMode(fake.nvmlDeviceGetHandleByIndex(1)) == [0, 1]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetMigMode(fake.nvmlDeviceGetHandleByIndex(2))
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        from_spec("unavailable").nvmlInit()
