"""Two replicas of every scheduling service under load: balancers race on the same shard through the
compare-and-set, the registry's replicas share their durable consumers. Killing one replica of each with
SIGKILL mid-load, and starting it again later, loses no job and runs none twice: one terminal state per job, one
completed exit per finished job, no slice double-booked, nothing left holding slices.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from fault_harness import (
    Load,
    Servers,
    assert_accounted,
    converge,
    jobs_for,
    kill9,
    make_stack,
    placement_pause,
    restart,
    settings_of,
)

from migsched.stack import Stack
from shared.bus import JetStreamBus

pytestmark = [pytest.mark.e2e, pytest.mark.ha, pytest.mark.timeout(150)]

JOBS = 240
RATE = 60.0


@pytest.fixture(scope="module")
def stack(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    st = make_stack(servers, "p" + uuid.uuid4().hex[:8], tmp_path_factory.mktemp("replica-run"), replicas=2)
    try:
        asyncio.run(st.wait_ready(60))
        yield st
    finally:
        st.stop(servers=False)


async def test_losing_one_of_two_replicas_of_each_service_under_load_loses_no_job(
    stack: Stack,
) -> None:
    assert {p.name for p in stack.procs} >= {"balancer", "balancer-2", "registry", "registry-2"}
    bus = await JetStreamBus.connect(settings_of(stack), name="replica-load")
    jobs = jobs_for("rep", JOBS)
    load = Load(bus, jobs, RATE)
    killed = ["balancer-2", "registry-2", "migration-planner-2"]
    try:
        task = asyncio.create_task(load.run())
        await load.until_published(0.3)
        for name in killed:
            kill9(stack, name)
        await load.until_published(0.7, timeout=60)
        for name in killed:
            restart(stack, name)
        await asyncio.wait_for(task, 90)
    finally:
        await bus.close()
    ids = [j.job_id for j in jobs]
    out = await converge(stack, ids, timeout=90)
    assert_accounted(out, ids)
    print(f"\none replica of each service killed and restarted; longest pause between placements "
          f"{await placement_pause(stack, ids):.2f} s")
