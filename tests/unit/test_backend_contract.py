"""One contract for every executor backend: the sim backend and the NVML backend over the faithful NVML fake.

Whatever runs underneath, the executor must see the same behaviour: explicit placements, the driver's refusal
rules with the same typed errors, listing with placements, idempotent destroy, workload exits, and
make-before-break moves.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pynvml
import pytest

from services.executor.backend import (
    Backend,
    BackendError,
    InsufficientResourcesError,
    InUseError,
    NotMigModeError,
    WorkloadError,
    WorkloadSpec,
    move_workload,
)
from services.executor.backends import make_backend
from services.executor.nvml_fake import FakeGpu, FakeNvml

pytestmark = pytest.mark.unit

PY = sys.executable
# A100-40GB profile IDs (not enums): 1g.5gb=19, 1g.5gb+me=20, 2g.10gb=14, 3g.20gb=9, 4g.20gb=5, 7g.40gb=0
P1G, P1G_ME, P2G, P3G, P4G, P7G = 19, 20, 14, 9, 5, 0


def until_stopped() -> WorkloadSpec:
    return WorkloadSpec(argv=(PY, "-c", "import time; time.sleep(60)"), duration_s=None)


def quick(status: int = 0) -> WorkloadSpec:
    return WorkloadSpec(argv=(PY, "-c", f"raise SystemExit({status})"), duration_s=0.01)


@pytest.fixture(params=["sim", "nvml-fake"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "sim":
        b = make_backend(
            "sim",
            node="n1",
            models=["A100-40GB", "A100-40GB", "H100-80GB"],
            reconfig_latency_s=0.0,
            mig_disabled=[2],
        )
    else:
        fake = FakeNvml([FakeGpu("A100-40GB"), FakeGpu("A100-40GB"), FakeGpu("H100-80GB", mig_current=0)])
        b = make_backend(
            "nvml",
            node="n1",
            models=["A100-40GB", "A100-40GB", "H100-80GB"],
            nvml=fake,
            state_dir=tmp_path / "state",
            stop_grace_s=5.0,
            confirm_s=0.2,
            adopt_poll_s=0.05,
        )
    yield b
    for job in list(b.running()):
        await b.stop_workload(job)
    await b.close()


async def test_the_backend_satisfies_the_protocol_and_discovers_every_gpu(backend: Backend) -> None:
    assert isinstance(backend, Backend)
    gpus = await backend.discover()
    assert [g.index for g in gpus] == [0, 1, 2]
    assert [g.model for g in gpus] == ["A100-40GB", "A100-40GB", "H100-80GB"]
    assert [g.mig_enabled for g in gpus] == [True, True, False]
    assert len({g.uuid for g in gpus}) == 3


async def test_an_instance_is_created_exactly_at_the_requested_placement_with_a_mig_uuid(
    backend: Backend,
) -> None:
    await backend.discover()
    inst = await backend.create_instance(0, P3G, 4)
    assert (inst.gpu_index, inst.profile_id, inst.profile, inst.start, inst.size) == (0, P3G, "3g.20gb", 4, 4)
    assert inst.uuid.startswith("MIG-")
    assert inst.ci_id is not None
    assert inst.owned


async def test_an_overlapping_placement_is_refused_as_insufficient_resources(backend: Backend) -> None:
    await backend.discover()
    await backend.create_instance(0, P3G, 4)
    with pytest.raises(InsufficientResourcesError) as err:
        await backend.create_instance(0, P2G, 4)
    assert err.value.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    # the neighbouring half is still free
    await backend.create_instance(0, P4G, 0)


async def test_a_profile_beyond_its_max_count_is_refused(backend: Backend) -> None:
    await backend.discover()
    await backend.create_instance(0, P1G_ME, 0)
    with pytest.raises(InsufficientResourcesError):
        await backend.create_instance(0, P1G_ME, 1)


async def test_a_start_the_profile_cannot_use_is_an_invalid_argument_not_a_conflict(backend: Backend) -> None:
    await backend.discover()
    with pytest.raises(BackendError) as err:
        await backend.create_instance(0, P3G, 2)
    assert not isinstance(err.value, InsufficientResourcesError)
    assert err.value.code == pynvml.NVML_ERROR_INVALID_ARGUMENT


async def test_listing_shows_every_instance_with_its_placement(backend: Backend) -> None:
    await backend.discover()
    await backend.create_instance(0, P1G, 6)
    await backend.create_instance(0, P2G, 0)
    listed = await backend.list_instances(0)
    assert [(i.profile, i.start, i.size) for i in listed] == [("2g.10gb", 0, 2), ("1g.5gb", 6, 1)]
    assert await backend.list_instances(1) == []


async def test_destroy_frees_the_slices_and_is_idempotent(backend: Backend) -> None:
    await backend.discover()
    whole = await backend.create_instance(1, P7G, 0)
    await backend.destroy_instance(1, whole.gi_id)
    await backend.destroy_instance(1, whole.gi_id)  # redelivered command: no error
    assert await backend.list_instances(1) == []
    again = await backend.create_instance(1, P7G, 0)
    assert again.start == 0


async def test_a_gpu_not_in_mig_mode_is_refused_with_instructions(backend: Backend) -> None:
    await backend.discover()
    with pytest.raises(NotMigModeError) as err:
        await backend.create_instance(2, P1G, 0)
    assert "nvidia-smi -i 2 -mig 1" in str(err.value)


async def test_a_workload_exit_is_reported_once_with_its_status(backend: Backend) -> None:
    await backend.discover()
    inst = await backend.create_instance(0, P2G, 2)
    await backend.start_workload("job-1", inst, quick())
    done = await asyncio.wait_for(backend.next_exit(), 20)
    assert (done.job_id, done.status, done.reason) == ("job-1", 0, "completed")
    assert "job-1" not in backend.running()


async def test_a_stopped_workload_reports_stopped_and_frees_the_instance(backend: Backend) -> None:
    await backend.discover()
    inst = await backend.create_instance(0, P2G, 2)
    assert await backend.start_workload("job-2", inst, until_stopped()) is True
    assert backend.running()["job-2"].gi_id == inst.gi_id
    assert await backend.start_workload("job-2", inst, until_stopped()) is False  # redelivered: starts nothing
    await backend.stop_workload("job-2")
    done = await asyncio.wait_for(backend.next_exit(), 20)
    assert (done.job_id, done.status, done.reason) == ("job-2", -15, "stopped")
    await backend.destroy_instance(0, inst.gi_id)


async def test_an_instance_with_a_running_job_is_never_destroyed(backend: Backend) -> None:
    await backend.discover()
    inst = await backend.create_instance(0, P1G, 3)
    await backend.start_workload("busy", inst, until_stopped())
    with pytest.raises(InUseError):
        await backend.destroy_instance(0, inst.gi_id)
    assert [i.gi_id for i in await backend.list_instances(0)] == [inst.gi_id]
    with pytest.raises(WorkloadError):
        await backend.start_workload("other", inst, until_stopped())


async def test_a_move_starts_the_target_before_stopping_the_source_and_reports_no_exit(
    backend: Backend,
) -> None:
    await backend.discover()
    source = await backend.create_instance(0, P3G, 0)
    target = await backend.create_instance(1, P3G, 4)
    await backend.start_workload("mover", source, until_stopped())
    await move_workload(backend, "mover", target, until_stopped(), confirm_s=0.1)
    assert backend.running()["mover"].gpu_index == 1
    await backend.destroy_instance(0, source.gi_id)  # the source is free again
    await backend.stop_workload("mover")
    done = await asyncio.wait_for(backend.next_exit(), 20)
    assert (done.job_id, done.reason) == ("mover", "stopped")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(backend.next_exit(), 0.1)  # the retired source copy never reports an exit


async def test_a_move_whose_target_dies_during_confirmation_keeps_the_source(backend: Backend) -> None:
    await backend.discover()
    source = await backend.create_instance(0, P2G, 0)
    target = await backend.create_instance(0, P2G, 2)
    await backend.start_workload("stay", source, until_stopped())
    spec = WorkloadSpec(argv=(PY, "-c", "raise SystemExit(3)"), duration_s=0.0)
    with pytest.raises(WorkloadError, match="source keeps running"):
        await move_workload(backend, "stay", target, spec, confirm_s=5.0)
    assert backend.running()["stay"].gi_id == source.gi_id
