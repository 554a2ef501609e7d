"""The executor on GPUs that are not in MIG mode: the per-GPU configuration syntax, whole-GPU and time-sliced
bindings on the sim backend and on the NVML backend (over its fake), and MIG operations still refused there."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from services.executor.backend import BackendError, NotMigModeError, WorkloadSpec
from services.executor.config import ExecutorError, GpuSpec, parse_gpu_specs, parse_gpus
from services.executor.nvml_backend import NvmlBackend
from services.executor.nvml_fake import FakeGpu, FakeNvml
from services.executor.plain import plain_target
from services.executor.sim_backend import SimBackend
from shared.events import Command, PlainSlot

pytestmark = pytest.mark.unit
PY = sys.executable


def place(job: str, *slots: PlainSlot) -> Command:
    return Command(id=f"c-{job}", cmd_id=f"c-{job}", kind="place", node="n1", job_id=job,
                   instance_id=slots[0].instance_id, gpu_index=slots[0].gpu_index, plain=slots, at=1.0)


def whole(index: int, job: str) -> PlainSlot:
    return PlainSlot(gpu_index=index, instance_id=f"n1/{index}:gpu@0:{job}", profile="gpu")


def share(index: int, job: str, replica: int) -> PlainSlot:
    return PlainSlot(gpu_index=index, instance_id=f"n1/{index}:shared@{replica}:{job}", profile="shared",
                     replica=replica)


def test_the_gpu_list_sets_the_sharing_mode_per_gpu() -> None:
    specs = parse_gpu_specs("A100-40GB:2,A100-40GB:1:whole, H100-80GB:2:shared=4")
    assert specs == [
        GpuSpec("A100-40GB"), GpuSpec("A100-40GB"), GpuSpec("A100-40GB", mig=False),
        GpuSpec("H100-80GB", mig=False, replicas=4), GpuSpec("H100-80GB", mig=False, replicas=4),
    ]
    assert parse_gpus("A100-40GB:8") == ["A100-40GB"] * 8  # the old syntax is unchanged
    assert parse_gpu_specs("A100-40GB:1:mig") == [GpuSpec("A100-40GB")]


@pytest.mark.parametrize("bad", ["A100-40GB:1:shared=0", "A100-40GB:1:shared=x", "A100-40GB:1:timeslice",
                                 "A100-40GB:1:shared=65"])
def test_a_bad_sharing_mode_is_refused_with_the_entry(bad: str) -> None:
    with pytest.raises(ExecutorError, match="A100-40GB:1:"):
        parse_gpu_specs(bad)


async def test_the_sim_backend_runs_whole_gpus_and_shares_and_refuses_mig_ops_there() -> None:
    b = SimBackend(node="n1", models=["A100-40GB"] * 3, mig_disabled=[1, 2], reconfig_latency_s=0.0)
    gpus = await b.discover()
    assert [g.mig_enabled for g in gpus] == [True, False, False]
    gang = plain_target(place("g", whole(1, "g"), whole(2, "g")), gpus)
    assert gang.uuid == f"{b.gpu_uuid(1)},{b.gpu_uuid(2)}" and gang.gpus == (1, 2)
    await b.start_workload("g", gang, WorkloadSpec(duration_s=None))
    await b.start_workload("g", gang, WorkloadSpec(duration_s=None))  # a replayed command: no second run
    assert list(b.running()) == ["g"]
    with pytest.raises(NotMigModeError):
        await b.create_instance(1, 19, 0)
    with pytest.raises(NotMigModeError):
        await b.list_instances(2)
    with pytest.raises(BackendError, match="MIG mode"):  # a plain job never runs on a MIG GPU
        plain_target(place("x", whole(0, "x")), gpus)
    await b.stop_workload("g")
    exit_ = await asyncio.wait_for(b.next_exit(), 5)
    assert exit_.job_id == "g" and exit_.reason == "stopped"
    for r in range(2):  # two shares of one GPU run side by side
        await b.start_workload(f"s{r}", plain_target(place(f"s{r}", share(2, f"s{r}", r)), gpus), WorkloadSpec())
    assert sorted(b.running()) == ["s0", "s1"]
    await b.close()


@pytest.fixture
async def nvml_node(tmp_path: Path) -> AsyncIterator[NvmlBackend]:
    b = NvmlBackend(
        node="n1",
        nvml=FakeNvml([FakeGpu("A100-40GB"), FakeGpu("A100-40GB", mig_current=0), FakeGpu("A100-40GB", mig_current=0)]),
        state_dir=tmp_path,
        env_allowlist=("PATH",),
        stop_grace_s=5.0,
    )
    yield b
    for job in list(b.running()):
        await b.stop_workload(job)
    await b.close()


async def test_the_nvml_backend_binds_a_gang_to_the_gpu_uuids_and_keeps_refusing_mig_ops(
    nvml_node: NvmlBackend,
) -> None:
    b = nvml_node
    gpus = await b.discover()
    assert [g.mig_enabled for g in gpus] == [True, False, False]
    gang = plain_target(place("g", whole(1, "g"), whole(2, "g")), gpus)
    code = "import json, os; print(json.dumps(os.environ['CUDA_VISIBLE_DEVICES']))"
    await b.start_workload("g", gang, WorkloadSpec(argv=(PY, "-c", code), env={"CUDA_VISIBLE_DEVICES": "0"}))
    done = await asyncio.wait_for(b.next_exit(), 20)
    assert done.status == 0
    seen = json.loads(done.output_tail.strip().splitlines()[-1])
    assert seen == f"{gpus[1].uuid},{gpus[2].uuid}" and seen.startswith("GPU-")
    with pytest.raises(NotMigModeError):
        await b.create_instance(1, 19, 0)
    with pytest.raises(BackendError, match="MIG mode"):  # a whole-GPU binding on the MIG GPU is refused
        await b.start_workload("x", msgspec.structs.replace(gang, gpus=(0,)), WorkloadSpec(argv=(PY,)))


async def test_the_nvml_backend_runs_several_shares_on_one_gpu(nvml_node: NvmlBackend) -> None:
    b = nvml_node
    gpus = await b.discover()
    for r in range(2):
        target = plain_target(place(f"s{r}", share(1, f"s{r}", r)), gpus)
        await b.start_workload(f"s{r}", target, WorkloadSpec(argv=(PY, "-c", "import time; time.sleep(30)")))
    assert sorted(b.running()) == ["s0", "s1"]
    assert {i.uuid for i in b.running().values()} == {gpus[1].uuid}

