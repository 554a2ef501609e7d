"""NVML backend over the faithful fake: adoption, ownership, in-use retries, discovery and error mapping."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
from pathlib import Path

import msgspec
import pynvml
import pytest

from services.executor.backend import (
    BackendError,
    BackendUnavailableError,
    InstanceInfo,
    InsufficientResourcesError,
    InUseError,
    NotMigModeError,
    NotOwnedError,
    PermissionDeniedError,
    WorkloadSpec,
)
from services.executor.instances import InstanceBook
from services.executor.nvml_backend import NvmlBackend
from services.executor.nvml_errors import error_for_code
from services.executor.nvml_fake import FakeGpu, FakeNvml
from services.executor.nvml_state import StateStore
from services.executor.process import proc_start_time
from services.executor.registration import Registration
from services.executor.service import ExecutorSettings
from services.executor.workload import GroupRun
from shared.bus import MemoryBus
from shared.events import Registered, decode
from shared.mig.geometry import default_geometry
from shared.settings import load

pytestmark = pytest.mark.unit

P1G, P2G, P3G, P7G = 19, 14, 9, 0
DESTROYS = ("nvmlGpuInstanceDestroy", "nvmlComputeInstanceDestroy")


def forever() -> WorkloadSpec:
    return WorkloadSpec(argv=(sys.executable, "-c", "import time; time.sleep(60)"))


def backend(fake: FakeNvml, state_dir: Path, **options: object) -> NvmlBackend:
    opts: dict[str, object] = {"adopt_poll_s": 0.02, "stop_grace_s": 5.0, "in_use_retry_s": 5.0}
    opts.update(options)
    return NvmlBackend(node="n1", nvml=fake, state_dir=state_dir, **opts)  # type: ignore[arg-type]


async def wait_gone(pid: int) -> None:
    for _ in range(500):
        if proc_start_time(pid) is None:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"pid {pid} did not go away")


async def test_a_restarted_backend_adopts_its_instances_and_running_job_and_destroys_nothing(
    tmp_path: Path,
) -> None:
    fake = FakeNvml([FakeGpu("A100-40GB", instances=(("1g.5gb", 6),))])
    first = backend(fake, tmp_path)
    await first.discover()
    busy = await first.create_instance(0, P3G, 0)
    idle = await first.create_instance(0, P2G, 4)
    await first.start_workload("long", busy, msgspec.structs.replace(forever(), started_by="place:long:3"))
    await first.close()  # the executor goes away; its workload and instances stay

    seen = len(fake.calls)
    second = backend(fake, tmp_path)
    await second.discover()
    rec = second.reconciliation
    assert (rec.owned_instances, rec.foreign_instances, rec.adopted_jobs, rec.lost_jobs) == (
        2,
        1,
        ("long",),
        (),
    )
    assert not any(c in DESTROYS for c in fake.calls[seen:])
    assert second.running()["long"].gi_id == busy.gi_id
    owned = {i.gi_id: i.owned for i in await second.list_instances(0)}
    assert owned == {busy.gi_id: True, idle.gi_id: True, 1: False}

    with pytest.raises(InUseError):
        await second.destroy_instance(0, busy.gi_id)
    with pytest.raises(NotOwnedError):
        await second.destroy_instance(0, 1)
    await second.destroy_instance(0, idle.gi_id)
    await second.stop_workload("long")
    done = await asyncio.wait_for(second.next_exit(), 20)
    assert (done.job_id, done.reason, done.status) == ("long", "stopped", -15)
    assert done.started_by == "place:long:3"  # the registry still tells this run from a later placement's
    await second.destroy_instance(0, busy.gi_id)
    assert fake.snapshot(0) == [("1g.5gb", 6, 1)]
    await second.close()


async def test_a_restarted_executor_registers_an_adopted_run_with_the_command_that_started_it(
    tmp_path: Path,
) -> None:
    fake = FakeNvml([FakeGpu("A100-40GB")])
    first = backend(fake, tmp_path)
    await first.discover()
    busy = await first.create_instance(0, P3G, 0)
    await first.start_workload("long", busy, msgspec.structs.replace(forever(), started_by="place:long:3"))
    await first.close()

    second = backend(fake, tmp_path)
    settings = load(ExecutorSettings, env={}, node="n1", executor_gpus="A100-40GB:1", metrics_port=0)
    bus = MemoryBus(settings)
    await bus.ensure_streams()
    runs: dict[str, str] = {}
    book = InstanceBook(second, {0: default_geometry().model("A100-40GB")})
    registration = Registration(bus, second, book, "n1", settings, runs)
    await registration.register()
    assert second.reconciliation.started_by == {"long": "place:long:3"}
    assert runs == {"long": "place:long:3"}  # the executor's run table knows it again
    (reg,) = [m for sub, d, _ in bus.sent if isinstance(m := decode(sub, d, bus.subjects), Registered)]
    (inst,) = reg.gpus[0].instances
    assert (inst.job_id, inst.started_by) == ("long", "place:long:3")  # a stop of it names that command
    await second.stop_workload("long")
    await second.close()


async def left_running(fake: FakeNvml, state_dir: Path, job: str, spec: WorkloadSpec) -> InstanceInfo:
    """``job`` started on a new 7g instance by an executor that then goes away (an upgrade, a crash) while the
    job runs; returns the instance."""
    first = backend(fake, state_dir)
    await first.discover()
    inst = await first.create_instance(0, P7G, 0)
    await first.start_workload(job, inst, spec)
    await first.close()
    return inst


async def test_a_job_that_ended_while_the_executor_was_down_is_reported_lost(tmp_path: Path) -> None:
    fake = FakeNvml([FakeGpu("A100-40GB")])
    inst = await left_running(fake, tmp_path, "gone", forever())
    pid = StateStore(tmp_path, "n1").load().jobs[0].pid
    os.killpg(pid, signal.SIGKILL)
    await wait_gone(pid)

    second = backend(fake, tmp_path)
    await second.discover()
    assert second.reconciliation.lost_jobs == ("gone",)
    done = await asyncio.wait_for(second.next_exit(), 20)
    assert (done.job_id, done.reason, done.status_known) == ("gone", "lost", False)
    assert [i.gi_id for i in await second.list_instances(0)] == [inst.gi_id]  # the instance is kept
    await second.close()


def until(flag: Path, then: str) -> WorkloadSpec:
    """A workload that waits for ``flag`` to exist, then runs ``then``."""
    wait = f"while not os.path.exists({str(flag)!r}): time.sleep(0.01)"
    return WorkloadSpec(argv=(sys.executable, "-c", f"import os, sys, time\n{wait}\n{then}"))


@pytest.mark.parametrize(("code", "reason"), [(0, "completed"), (3, "failed")])
async def test_a_job_that_ended_while_the_executor_was_down_is_reported_with_its_own_status(
    tmp_path: Path, code: int, reason: str
) -> None:
    fake = FakeNvml([FakeGpu("A100-40GB")])
    flag = tmp_path / "go"
    await left_running(fake, tmp_path, "ends", until(flag, f"print('done'); sys.exit({code})"))
    flag.touch()  # the job ends while no executor watches it
    await wait_gone(StateStore(tmp_path, "n1").load().jobs[0].pid)

    second = backend(fake, tmp_path)
    await second.discover()
    done = await asyncio.wait_for(second.next_exit(), 20)
    assert (done.job_id, done.reason, done.status, done.status_known) == ("ends", reason, code, True)
    assert done.output_tail == "done\n"
    assert not list((tmp_path / "logs").glob("*"))  # its status read once and its log, then both gone
    await second.close()


async def test_a_job_ending_after_the_executor_restarted_is_reported_with_its_own_status(tmp_path: Path) -> None:
    fake = FakeNvml([FakeGpu("A100-40GB")])
    flag = tmp_path / "go"
    await left_running(fake, tmp_path, "ends", until(flag, "sys.exit(0)"))

    second = backend(fake, tmp_path)
    await second.discover()
    assert second.reconciliation.adopted_jobs == ("ends",)
    flag.touch()  # the adopted job ends under the new executor, which is not its parent
    done = await asyncio.wait_for(second.next_exit(), 20)
    assert (done.job_id, done.reason, done.status_known) == ("ends", "completed", True)
    await second.close()


async def test_foreign_instances_are_destroyed_only_when_configured(tmp_path: Path) -> None:
    fake = FakeNvml([FakeGpu("A100-40GB", instances=(("3g.20gb", 4),))])
    careful = backend(fake, tmp_path / "a")
    with pytest.raises(NotOwnedError):
        await careful.destroy_instance(0, 1)
    assert fake.snapshot(0) == [("3g.20gb", 4, 1)]
    await careful.close()
    bold = backend(fake, tmp_path / "b", destroy_foreign=True)
    await bold.destroy_instance(0, 1)
    assert fake.snapshot(0) == []
    await bold.close()


async def test_destroy_retries_the_in_use_window_after_the_last_process_exits(tmp_path: Path) -> None:
    ticks = itertools.count()  # a fake clock: one tick per look, so the window is three looks long
    fake = FakeNvml([FakeGpu("A100-40GB")], release_window_s=3, clock=lambda: float(next(ticks)))
    b = backend(fake, tmp_path)
    inst = await b.create_instance(0, P2G, 0)
    fake.add_process(0, inst.gi_id, 4242)
    fake.end_process(0, inst.gi_id, 4242)
    await b.destroy_instance(0, inst.gi_id)
    assert fake.calls.count("nvmlComputeInstanceDestroy") >= 3  # refused twice, then done
    assert fake.snapshot(0) == []
    await b.close()


async def test_destroy_gives_up_with_in_use_after_the_bound_and_keeps_the_instance(tmp_path: Path) -> None:
    fake = FakeNvml([FakeGpu("A100-40GB")])
    b = backend(fake, tmp_path, in_use_retry_s=0.05)
    inst = await b.create_instance(0, P2G, 0)
    fake.add_process(0, inst.gi_id, 4242)  # someone else's process, never ending
    with pytest.raises(InUseError) as err:
        await b.destroy_instance(0, inst.gi_id)
    assert err.value.code == pynvml.NVML_ERROR_IN_USE
    assert fake.snapshot(0) == [("2g.10gb", 0, inst.gi_id)]
    await b.close()


async def test_a_gpu_not_in_mig_mode_is_listed_but_never_touched(tmp_path: Path) -> None:
    fake = FakeNvml([FakeGpu("H100-80GB", mig_current=0, mig_pending=1)])
    b = backend(fake, tmp_path)
    (gpu,) = await b.discover()
    assert (gpu.model, gpu.mig_enabled, gpu.mig_pending) == ("H100-80GB", False, True)
    for op in (b.list_instances(0), b.create_instance(0, P1G, 0), b.destroy_instance(0, 1)):
        with pytest.raises(NotMigModeError, match="pending"):
            await op
    assert not any("Create" in c or "Destroy" in c for c in fake.calls)
    await b.close()


async def test_the_nvml_table_wins_over_the_built_in_one_and_differences_are_reported(tmp_path: Path) -> None:
    a100 = default_geometry().model("A100-40GB")
    changed = tuple(
        msgspec.structs.replace(p, placements=(4,)) if p.name == "3g.20gb" else p
        for p in a100.profiles
        if p.name != "1g.10gb"
    )
    fake = FakeNvml([FakeGpu("A100-40GB", table=msgspec.structs.replace(a100, profiles=changed))])
    b = backend(fake, tmp_path)
    await b.discover()
    diffs = b.differences(0)
    assert any("3g.20gb" in d and "placements" in d and "{0,4}" in d and "{4}" in d for d in diffs)
    assert any("1g.10gb" in d and "does not offer" in d for d in diffs)
    assert any("placements" in n for n in b.reconciliation.notes)
    assert b.gpu_model(0).profile("3g.20gb").placements == (4,)
    with pytest.raises(BackendError) as err:
        await b.create_instance(0, P3G, 0)
    assert err.value.code == pynvml.NVML_ERROR_INVALID_ARGUMENT
    with pytest.raises(BackendError, match="offers no profile ID 15"):
        await b.create_instance(0, 15, 0)
    await b.close()


async def test_a_gpu_model_unknown_to_the_tables_is_described_from_nvml(tmp_path: Path) -> None:
    a100 = default_geometry().model("A100-40GB")
    future = msgspec.structs.replace(a100, name="X-1", aliases=(), pci_device_ids=())
    fake = FakeNvml([FakeGpu("A100-40GB", name="NVIDIA Future X1", pci_device_id=0x9999, table=future)])
    b = backend(fake, tmp_path)
    (gpu,) = await b.discover()
    assert gpu.model == "NVIDIA Future X1"
    assert "no built-in table" in b.differences(0)[0]
    assert b.gpu_model(0).profile("3g.20gb").placements == (0, 4)
    await b.close()


async def test_no_nvml_library_is_a_clear_unavailable_error(tmp_path: Path) -> None:
    b = backend(FakeNvml([], available=False), tmp_path)
    with pytest.raises(BackendUnavailableError, match="libnvidia-ml") as err:
        await b.discover()
    assert err.value.code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND


async def test_an_unwritable_state_dir_is_a_clear_unavailable_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    b = backend(FakeNvml([FakeGpu()]), blocker / "state")
    with pytest.raises(BackendUnavailableError, match="MIGSCHED_EXECUTOR_STATE_DIR"):
        await b.discover()


@pytest.mark.parametrize(
    ("code", "cls", "words"),
    [
        (pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, InsufficientResourcesError, "overlaps"),
        (pynvml.NVML_ERROR_IN_USE, InUseError, "retry"),
        (pynvml.NVML_ERROR_NO_PERMISSION, PermissionDeniedError, "root"),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, BackendError, "MIG mode"),
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, BackendError, "placement"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, BackendUnavailableError, "driver"),
        (pynvml.NVML_ERROR_GPU_IS_LOST, BackendError, "reset"),
        (12345, BackendError, "unexpected"),
    ],
)
def test_every_nvml_error_becomes_a_typed_error_with_its_code_and_advice(
    code: int, cls: type[BackendError], words: str
) -> None:
    err = error_for_code(code, "create 3g.20gb at memory slice 4 on GPU 0")
    assert type(err) is cls
    assert err.code == code
    assert f"NVML error {code}" in str(err)
    assert words in str(err)
    assert str(err).startswith("create 3g.20gb at memory slice 4 on GPU 0 failed")


def test_an_insufficient_resources_error_from_the_driver_keeps_the_code(tmp_path: Path) -> None:
    async def run() -> None:
        b = backend(FakeNvml([FakeGpu()]), tmp_path)
        await b.create_instance(0, P7G, 0)
        with pytest.raises(InsufficientResourcesError, match="NVML_ERROR_INSUFFICIENT_RESOURCES"):
            await b.create_instance(0, P1G, 3)
        await b.close()

    asyncio.run(run())


class _NoComputeInstances(FakeNvml):
    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: object, profileId: int) -> object:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)


async def test_a_gi_whose_compute_instance_cannot_be_made_is_rolled_back(tmp_path: Path) -> None:
    fake = _NoComputeInstances([FakeGpu("A100-40GB")])
    b = backend(fake, tmp_path)
    with pytest.raises(PermissionDeniedError, match="root"):
        await b.create_instance(0, P3G, 4)
    assert fake.snapshot(0) == []
    await b.close()


class _OldDriver(FakeNvml):
    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: object, profile: int, version: int = 2) -> object:
        if version == 2:  # no nvmlDeviceGetGpuInstanceProfileInfoV before R470
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return super().nvmlDeviceGetGpuInstanceProfileInfo(device, profile, version)


async def test_an_old_driver_without_the_v2_profile_call_is_read_with_v1(tmp_path: Path) -> None:
    b = backend(_OldDriver([FakeGpu("A100-40GB")]), tmp_path)
    await b.discover()
    model = b.gpu_model(0)
    assert model.profile_by_id(P3G).placements == (0, 4)
    assert model.profile_by_id(P1G).name == "1g.5gb"  # named from slices and memory when NVML gives no name
    await b.close()


async def test_a_restarted_backend_adopts_a_gang_part_started_per_gpu_as_one_run(tmp_path: Path) -> None:
    from services.executor.launch import gang_procs
    from shared.events import GangLaunch

    fake = FakeNvml([FakeGpu("A100-40GB", mig_current=0), FakeGpu("A100-40GB", mig_current=0)])
    first = backend(fake, tmp_path)
    gpus = await first.discover()
    binding = InstanceInfo(gpu_index=0, gi_id=2048, ci_id=None, profile_id=0, profile="gpu", start=0, size=0,
                           uuid=",".join(g.uuid for g in gpus), gpus=(0, 1))
    gang = GangLaunch(world_size=4, first_rank=2, node_rank=1, hosts=("a", "n1"), master_addr="a", master_port=29501)
    spec = msgspec.structs.replace(forever(), procs=gang_procs(gang, [0, 1]))
    await first.start_workload("g", binding, spec)
    await first.close()  # the executor goes away; both processes stay

    second = backend(fake, tmp_path)
    await second.discover()
    assert second.reconciliation.adopted_jobs == ("g",)
    run = second._jobs.get("g")
    assert isinstance(run, GroupRun) and len(run.runs) == 2
    pids = [r.pid for r in run.runs]  # type: ignore[attr-defined]
    await second.stop_workload("g")  # one stop ends the whole part
    done = await asyncio.wait_for(second.next_exit(), 20)
    assert (done.job_id, done.reason) == ("g", "stopped")
    for pid in pids:
        await wait_gone(pid)
    await second.close()
