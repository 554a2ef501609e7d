"""Whole-GPU gangs and time-sliced shares through the stack as processes (balancer, registry, migration
planner, a sim executor whose node mixes MIG GPUs, whole-only GPUs and a time-sliced GPU): every job lands on
its own kind of GPU, the gang on two GPUs of the node, shares up to the replicas, and everything finishes with
the state clean."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from stack_fixture import exits_on_stream, running_stack, settings_of

from migsched.stack import Stack
from shared.bus import JetStreamBus
from shared.events import Demand, JobSubmit
from shared.mig.geometry import default_geometry
from shared.state import JobRecord, RedisState, audit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
# per executor: GPUs 0-1 MIG, 2-3 not in MIG mode (whole GPUs only), 4 not in MIG mode, time-sliced into 2
GPUS = "A100-40GB:2,A100-40GB:2:whole,A100-40GB:1:shared=2"


def job(job_id: str, demand: Demand, duration_s: float) -> JobSubmit:
    return JobSubmit(id=f"s-{job_id}", job_id=job_id, demand=demand, duration_hint_s=duration_s,
                     submitted_at=time.time())


async def _run(stack: Stack) -> tuple[dict[str, list[JobRecord]], list[str], dict[str, int]]:
    st = settings_of(stack)
    await stack.wait_ready(60)  # its services create the streams; every executor GPU is registered
    bus = await JetStreamBus.connect(st)
    state = RedisState.from_settings(st)
    try:
        seen: dict[str, list[JobRecord]] = {}

        async def watch(ids: list[str]) -> None:
            for j in await state.jobs(ids):
                if j is not None and j.state in ("placing", "running"):
                    seen.setdefault(j.job_id, []).append(j)

        # long enough to watch them run, short enough to finish (the executor runs at wall speed here)
        subs = [
            job("m1", Demand(kind="mig", profile="3g.20gb"), 3.0),
            job("gang", Demand(kind="gpus", gpus=2), 3.0),
            job("sh1", Demand(kind="shared"), 3.0),
            job("sh2", Demand(kind="shared"), 3.0),
            job("sh3", Demand(kind="shared"), 1.0),  # waits for a replica
        ]
        for s in subs:
            await bus.publish(bus.subjects.jobs_submit, s)
        ids = [s.job_id for s in subs]
        waited_for_replica = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            await watch(ids)
            jobs = {j.job_id: j for j in await state.jobs(ids) if j is not None}
            running_shares = sum(1 for k in ("sh1", "sh2", "sh3") if k in jobs and jobs[k].state == "running")
            assert running_shares <= 2, "more shares than replicas ran at once"
            sh3 = jobs.get("sh3")
            if sh3 is not None and sh3.state == "pending" and running_shares == 2:
                waited_for_replica = True
            if len(jobs) == len(ids) and all(j.state == "finished" for j in jobs.values()):
                break
            await asyncio.sleep(0.05)
        final = {j.job_id: j.state for j in await state.jobs(ids) if j is not None}
        violations = [str(v) for v in await audit(state, default_geometry())]
        gpus = await state.load_gpus()
        left = {g.id: len(g.instances) for g in gpus if g.instances and not g.mig}
        exits = await exits_on_stream(bus)
        gang_exit = [e for e in exits if e.job_id == "gang"]
        assert final == dict.fromkeys(ids, "finished"), final
        assert violations == []
        assert waited_for_replica
        assert len(gang_exit) == 1 and len(gang_exit[0].slots) == 2
        return seen, violations, left
    finally:
        await state.close()
        await bus.close()


def test_gangs_shares_and_mig_jobs_run_on_their_own_kind_of_gpu(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    with running_stack(prefix, nats_url, redis_url, tmp_path, executors=1, gpus=GPUS) as stack:
        seen, _violations, left = asyncio.run(_run(stack))
    node_gpu = {j: {int(r.gpu.rsplit("/", 1)[1]) for r in recs} for j, recs in seen.items()}
    assert node_gpu["m1"] <= {0, 1}  # MIG on a MIG GPU
    gang = seen["gang"][-1]
    assert {int(g.rsplit("/", 1)[1]) for g, _ in gang.slots} == {2, 3}  # both whole GPUs of the node
    for s in ("sh1", "sh2", "sh3"):
        assert node_gpu[s] == {4}  # shares on the time-sliced GPU only
    assert left == {}  # plain instances leave with their jobs
