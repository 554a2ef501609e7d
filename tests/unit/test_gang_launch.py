"""A gang's part on one node: the processes the executor starts and the environment each one gets, and how the
part ends when one of its processes fails."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from services.executor.backend import InstanceInfo, WorkloadSpec
from services.executor.launch import gang_procs, proc_env
from services.executor.sim_backend import SimBackend
from shared.events import GangLaunch

pytestmark = pytest.mark.unit


def _gang(launch: str = "per-gpu", first_rank: int = 4, node_rank: int = 1) -> GangLaunch:
    return GangLaunch(launch=launch, world_size=7, first_rank=first_rank, node_rank=node_rank,  # type: ignore[arg-type]
                      hosts=("a", "b", "c"), master_addr="10.0.0.1", master_port=29517)


def test_per_gpu_launch_starts_one_process_per_gpu_with_its_global_and_local_rank() -> None:
    procs = gang_procs(_gang(), [2, 5])
    assert [p.gpus for p in procs] == [(2,), (5,)]
    assert [(p.env["RANK"], p.env["LOCAL_RANK"]) for p in procs] == [("4", "0"), ("5", "1")]
    for p in procs:
        assert {k: p.env[k] for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "MASTER_ADDR",
                                      "MASTER_PORT", "MIGSCHED_GANG_HOSTS")} == {
            "WORLD_SIZE": "7", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1", "NNODES": "3",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29517", "MIGSCHED_GANG_HOSTS": "a,b,c"}


def test_per_node_launch_starts_one_process_with_every_gpu_of_the_node() -> None:
    (p,) = gang_procs(_gang("per-node"), [0, 1, 3])
    assert p.gpus == (0, 1, 3) and (p.env["RANK"], p.env["LOCAL_RANK"], p.env["LOCAL_WORLD_SIZE"]) == ("4", "0", "3")


def test_a_workload_may_choose_its_port_but_never_its_rank() -> None:
    (p, _) = gang_procs(_gang(), [0, 1])
    env = proc_env({"MASTER_PORT": "40000", "RANK": "99"}, p)
    assert env["MASTER_PORT"] == "40000" and env["RANK"] == "4"


_DUMP = (
    "import json, os, sys, time\n"
    "keys = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'CUDA_VISIBLE_DEVICES', 'MIGSCHED_JOB_ID')\n"
    "open(os.path.join(sys.argv[1], os.environ['RANK'] + '.json'), 'w').write("
    "json.dumps({k: os.environ.get(k) for k in keys}))\n"
    "code = int(sys.argv[2]) if os.environ['LOCAL_RANK'] == '1' else 0\n"
    "time.sleep(0.2 if code else float(sys.argv[3]))\n"
    "sys.exit(code)\n"
)


def _plain_binding(backend: SimBackend, gpus: tuple[int, ...]) -> InstanceInfo:
    return InstanceInfo(gpu_index=gpus[0], gi_id=2048, ci_id=None, profile_id=0, profile="gpu", start=0, size=0,
                        uuid="", gpus=gpus)


async def _run_part(tmp_path: Path, fail_code: int, sleep_s: float) -> tuple[object, list[dict[str, str]]]:
    backend = SimBackend(node="b", models=["A100-40GB"] * 4, mig_disabled=[0, 1, 2, 3], workloads="process",
                         log_dir=tmp_path / "logs")
    procs = gang_procs(_gang(), [1, 3])
    spec = WorkloadSpec(argv=(sys.executable, "-c", _DUMP, str(tmp_path), str(fail_code), str(sleep_s)),
                        procs=procs)
    await backend.start_workload("g1", _plain_binding(backend, (1, 3)), spec)
    ended = await asyncio.wait_for(backend.next_exit(), timeout=30)
    seen = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
    await backend.close()
    return ended, seen


async def test_a_simulated_node_in_process_mode_runs_each_rank_on_its_own_gpu(tmp_path: Path) -> None:
    ended, seen = await _run_part(tmp_path, 0, 0.1)
    backend = SimBackend(node="b", models=["A100-40GB"] * 4)
    assert (ended.status, ended.reason) == (0, "completed")  # type: ignore[attr-defined]
    assert [(s["RANK"], s["LOCAL_RANK"], s["WORLD_SIZE"], s["MIGSCHED_JOB_ID"]) for s in seen] == [
        ("4", "0", "7", "g1"), ("5", "1", "7", "g1")]
    assert [s["CUDA_VISIBLE_DEVICES"] for s in seen] == [backend.gpu_uuid(1), backend.gpu_uuid(3)]


async def test_the_first_failed_process_of_a_part_stops_the_others_and_is_the_parts_exit(tmp_path: Path) -> None:
    ended, seen = await _run_part(tmp_path, 3, 60.0)  # rank 5 fails at once; rank 4 would sleep a minute
    assert (ended.status, ended.reason) == (3, "failed")  # type: ignore[attr-defined]
    assert len(seen) == 2
