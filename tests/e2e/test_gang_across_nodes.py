"""A gang across nodes on the stack as processes: four simulated nodes of eight whole GPUs whose executors run
workloads as real processes (``MIGSCHED_EXECUTOR_SIM_WORKLOADS=process``). A 32-GPU gang starts on all four,
every one of its 32 processes sees its own GPU and the rank environment a torchrun-style job reads; when one
member node is lost, the other parts are stopped and the gang goes back to the queue; a gang bigger than the
cluster is rejected at submit with its reason."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from stack_fixture import running_stack, settings_of

from migsched.stack import Stack
from services.common.testing import until as wait_for
from shared.bus import JetStreamBus
from shared.events import Demand, JobSubmit, Workload
from shared.mig.geometry import default_geometry
from shared.state import RedisState, audit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

# each process writes what it sees, then runs until it is stopped
RANK_DUMP = (
    "import json, os, sys, time\n"
    "keys = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'NODE_RANK', 'NNODES', 'MASTER_ADDR',\n"
    "        'MASTER_PORT', 'MIGSCHED_GANG_HOSTS', 'CUDA_VISIBLE_DEVICES', 'MIGSCHED_JOB_ID')\n"
    "seen = {k: os.environ.get(k) for k in keys}\n"
    "seen['pid'] = os.getpid()\n"
    "path = os.path.join(sys.argv[1], os.environ['RANK'] + '.json')\n"
    "open(path + '.tmp', 'w').write(json.dumps(seen))\n"
    "os.replace(path + '.tmp', path)\n"
    "time.sleep(600)\n"
)



async def until(pred: Any, timeout: float = 60.0) -> bool:
    return await wait_for(pred, timeout)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _run(stack: Stack, out: Path) -> list[dict[str, object]]:
    st = settings_of(stack)
    await stack.wait_ready(60)
    bus = await JetStreamBus.connect(st)
    state = RedisState.from_settings(st)
    try:
        gang = JobSubmit(id="s-g32", job_id="g32", demand=Demand(kind="gpus", gpus=32), submitted_at=time.time(),
                         workload=Workload(argv=(sys.executable, "-c", RANK_DUMP, str(out))))
        await bus.publish(bus.subjects.jobs_submit, gang)

        async def all_ranks_up() -> bool:
            job = await state.job("g32")
            return job is not None and job.state == "running" and len(list(out.glob("*.json"))) == 32

        assert await until(all_ranks_up), f"state: {await state.job('g32')}, ranks: {len(list(out.glob('*.json')))}"
        seen = [json.loads(p.read_text()) for p in out.glob("*.json")]
        job = await state.job("g32")
        assert job is not None and len(job.slots) == 32 and len({g.rpartition("/")[0] for g, _ in job.slots}) == 4
        assert [str(v) for v in await audit(state, default_geometry())] == []

        # a member node is lost: its executor dies; the registry marks it lost after the timeout
        victim = next(p for p in stack.procs if p.name == "executor-gpu-node-2")
        assert victim.popen is not None
        victim.popen.kill()

        async def requeued() -> bool:
            j = await state.job("g32")
            return j is not None and j.state == "pending"

        assert await until(requeued)
        history = await state.history("g32")
        assert any(h.prev == "running" and h.to == "pending" and "gpu-node-2" in h.reason for h in history)
        lost_rank = seen_rank_of(seen, "gpu-node-2")
        others = [int(str(s["pid"])) for s in seen if s["NODE_RANK"] != lost_rank]

        async def others_stopped() -> bool:
            return not any(alive(pid) for pid in others)

        assert await until(others_stopped, 30)  # the other parts got their stop

        async def gpus_free() -> bool:
            gpus = await state.load_gpus()
            return not any(i.job == "g32" for g in gpus if g.node != "gpu-node-2" for i in g.instances)

        assert await until(gpus_free, 30)
        assert [str(v) for v in await audit(state, default_geometry())] == []

        huge = JobSubmit(id="s-huge", job_id="huge", demand=Demand(kind="gpus", gpus=33), submitted_at=time.time())
        await bus.publish(bus.subjects.jobs_submit, huge)

        async def rejected() -> bool:
            j = await state.job("huge")
            return j is not None and j.state == "rejected"

        assert await until(rejected, 30)
        j = await state.job("huge")
        assert j is not None and "needs 33 GPUs; the cluster has 32" in j.reason
        return seen
    finally:
        await state.close()
        await bus.close()


def seen_rank_of(seen: list[dict[str, object]], node: str) -> object:
    """The NODE_RANK of ``node``'s part."""
    (rank,) = {s["NODE_RANK"] for s in seen
               if str(s["MIGSCHED_GANG_HOSTS"]).split(",")[int(str(s["NODE_RANK"]))] == node}
    return rank


def test_a_32_gpu_gang_spans_four_nodes_with_its_ranks_and_a_lost_member_requeues_it(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "ranks"
    out.mkdir()
    env = {"MIGSCHED_EXECUTOR_SIM_WORKLOADS": "process", "MIGSCHED_NODE_TIMEOUT_S": "3",
           "MIGSCHED_EXECUTOR_STOP_GRACE_S": "1"}
    seen: list[dict[str, object]] = []
    try:
        with running_stack(prefix, nats_url, redis_url, tmp_path / "run", executors=4,
                           gpus="A100-40GB:8:whole", env=env) as stack:
            seen = asyncio.run(_run(stack, out))
    finally:
        for p in out.glob("*.json"):  # the lost node's processes outlive its executor, as on a real node
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(json.loads(p.read_text())["pid"]), signal.SIGKILL)
    hosts = {str(s["MIGSCHED_GANG_HOSTS"]) for s in seen}
    assert len(hosts) == 1 and sorted(hosts.pop().split(",")) == [f"gpu-node-{i}" for i in range(4)]
    assert sorted(int(str(s["RANK"])) for s in seen) == list(range(32))
    assert {(s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"], s["NNODES"], s["MIGSCHED_JOB_ID"]) for s in seen} == {
        ("32", "8", "4", "g32")}
    assert len({(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in seen}) == 1
    for s in seen:  # node by node in rank order, GPUs by index within a node
        assert int(str(s["RANK"])) == 8 * int(str(s["NODE_RANK"])) + int(str(s["LOCAL_RANK"]))
    devices = [str(s["CUDA_VISIBLE_DEVICES"]) for s in seen]
    assert all(d.startswith("GPU-") and "," not in d for d in devices) and len(set(devices)) == 32
