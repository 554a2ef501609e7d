"""The NVML backend on this machine's real GPUs, read-only: discovery, and workloads bound as the executor binds
them. Skipped where there is no NVIDIA driver. Nothing here changes MIG mode or creates or destroys an instance.

Runs without the suite's servers: ``python -m pytest --noconftest -m gpu tests/hardware``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import msgspec
import pytest

pynvml = pytest.importorskip("pynvml")

from migsched import cudaprobe  # noqa: E402
from services.executor.backend import GpuInfo, InstanceInfo, WorkloadExit, WorkloadSpec  # noqa: E402
from services.executor.config import ExecutorSettings, env_allowlist  # noqa: E402
from services.executor.launch import gang_procs  # noqa: E402
from services.executor.nvml_backend import NvmlBackend  # noqa: E402
from shared.events import GangLaunch  # noqa: E402
from shared.settings import load  # noqa: E402


def _gpu_count() -> int:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_gpu_count() == 0, reason="no NVIDIA GPU with a driver on this machine"),
]

PROBE = (sys.executable, "-m", "migsched.cudaprobe")
# The probe imports this package; the executor passes on only what the allowlist names.
PROBE_ENV = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
# What this node's executor would pass on (MIGSCHED_EXECUTOR_ENV_ALLOWLIST), and the probe's import path.
ALLOWLIST = (*env_allowlist(load(ExecutorSettings)), "PYTHONPATH")


def backend(tmp_path: Path) -> NvmlBackend:
    return NvmlBackend(node="hw", state_dir=tmp_path, env_allowlist=ALLOWLIST, keep_logs=True, stop_grace_s=2.0)


async def finish(b: NvmlBackend, job_id: str, binding: InstanceInfo, spec: WorkloadSpec) -> WorkloadExit:
    assert await b.start_workload(job_id, binding, spec)
    done = await asyncio.wait_for(b.next_exit(), 120)
    assert done.job_id == job_id
    return done


def probe_answers(tail: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in tail.splitlines() if line.startswith("{")]


async def whole_gpus(b: NvmlBackend) -> tuple[list[GpuInfo], list[int]]:
    """The node's GPUs and the indices of those not in MIG mode; skips the test (closing ``b``) when none is."""
    gpus = list(await b.discover())
    plain = [g.index for g in gpus if not g.mig_enabled]
    if not plain:
        await b.close()
        pytest.skip("every GPU is in MIG mode")
    return gpus, plain


def whole_gpu(gpus: list[GpuInfo], index: int) -> InstanceInfo:
    return InstanceInfo(
        gpu_index=index,
        gi_id=2048,
        ci_id=None,
        profile_id=0,
        profile="gpu",
        start=0,
        size=0,
        uuid=gpus[index].uuid,
        gpus=(index,),
    )


def test_the_backend_discovers_every_gpu_nvml_reports_by_its_uuid_and_model(tmp_path: Path) -> None:
    async def go() -> None:
        b = backend(tmp_path)
        gpus = await b.discover()
        await b.close()
        assert len(gpus) == _gpu_count()
        for g in gpus:
            assert g.uuid.startswith("GPU-") and g.pci_device_id.startswith("0x")
            print(f"GPU {g.index}: {g.model} {g.pci_device_id} mig={g.mig_enabled} {g.memory_gib} GiB")

    asyncio.run(go())


def test_a_workload_on_a_whole_gpu_sees_that_gpu_and_no_other(tmp_path: Path) -> None:
    async def go() -> None:
        b = backend(tmp_path)
        gpus, plain = await whole_gpus(b)
        done = await finish(b, "probe", whole_gpu(gpus, plain[0]), WorkloadSpec(argv=PROBE, env=PROBE_ENV))
        await b.close()
        assert (done.status, done.reason) == (0, "completed"), done.output_tail
        (seen,) = probe_answers(done.output_tail)
        assert seen["visible"] == gpus[plain[0]].uuid
        assert seen["count"] == 1
        assert cudaprobe.same_device(gpus[plain[0]].uuid, seen["uuids"][0])  # type: ignore[index]

    asyncio.run(go())


def test_a_gang_part_started_per_gpu_gets_its_rank_and_its_gpu(tmp_path: Path) -> None:
    async def go() -> None:
        b = backend(tmp_path)
        gpus, plain = await whole_gpus(b)
        gang = GangLaunch(
            world_size=2, first_rank=1, node_rank=1, hosts=("n0", "hw"), master_addr="n0", master_port=29501
        )
        argv = (
            sys.executable,
            "-c",
            "import os, runpy; print('RANK', os.environ['RANK'], os.environ['WORLD_SIZE'])"
            "; runpy.run_module('migsched.cudaprobe', run_name='__main__')",
        )
        spec = WorkloadSpec(argv=argv, env=PROBE_ENV, procs=gang_procs(gang, plain[:1]))
        done = await finish(b, "gang", whole_gpu(gpus, plain[0]), spec)
        await b.close()
        assert (done.status, done.reason) == (0, "completed"), done.output_tail
        assert "RANK 1 2" in done.output_tail
        (seen,) = probe_answers(done.output_tail)
        assert seen["count"] == 1 and cudaprobe.same_device(gpus[plain[0]].uuid, seen["uuids"][0])  # type: ignore[index]

    asyncio.run(go())


def test_existing_mig_instances_read_back_with_their_profile_and_bind_alone(tmp_path: Path) -> None:
    async def go() -> list[InstanceInfo]:
        b = backend(tmp_path)
        gpus = await b.discover()
        found = [i for g in gpus if g.mig_enabled for i in await b.list_instances(g.index)]
        for g in gpus:
            if g.mig_enabled:
                model = b.gpu_model(g.index)
                for inst in await b.list_instances(g.index):
                    assert model.profile_by_id(inst.profile_id).name == inst.profile
                    assert inst.start in model.profile_by_id(inst.profile_id).placements
        await b.close()
        return found

    instances = [i for i in asyncio.run(go()) if i.uuid]
    if not instances:
        pytest.skip("no MIG instance exists on this machine (and this check creates none)")
    for inst in instances:
        seen = cudaprobe.bound_probe(inst.uuid, ALLOWLIST)
        assert seen["ok"], msgspec.to_builtins(seen)
