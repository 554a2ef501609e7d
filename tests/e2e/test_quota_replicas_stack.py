"""Two balancer replicas with one tenancy file, as processes on real NATS and Redis: a burst of one tenant's jobs,
split between the replicas, never runs more of them at once than the tenant's quota, and every job still runs
to its end. Each replica's book lags the other's placements; the store's quota check in the reservation
(``lua/reserve.lua``) is what holds the quota."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_harness import Servers, assert_accounted, converge, make_stack, settings_of

from migsched.stack import Stack
from shared.bus import JetStreamBus
from shared.events import Demand, JobSubmit
from shared.state import ACTIVE_STATES, RedisState

pytestmark = [pytest.mark.e2e, pytest.mark.ha, pytest.mark.timeout(150)]

QUOTA = 6  # compute slices: six 1g jobs at once
JOBS = 72


@pytest.fixture(scope="module")
def stack(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run = tmp_path_factory.mktemp("quota-run")
    tenancy = Path(run) / "tenancy.toml"
    tenancy.write_text('[priority_classes.normal]\nvalue = 100\ndefault = true\n\n'
                       f'[tenants.team]\nquota = {{ compute_slices = {QUOTA} }}\n')
    st = make_stack(servers, "q" + uuid.uuid4().hex[:8], run, replicas=2,
                    env={"MIGSCHED_TENANCY_FILE": str(tenancy), "MIGSCHED_MIRROR_REFRESH_S": "30"})
    try:
        asyncio.run(st.wait_ready(60))
        yield st
    finally:
        st.stop(servers=False)


async def test_two_replicas_never_run_more_of_a_tenants_jobs_than_its_quota(stack: Stack) -> None:
    assert {p.name for p in stack.procs} >= {"balancer", "balancer-2"}
    bus = await JetStreamBus.connect(settings_of(stack), name="quota-load")
    state = RedisState.from_settings(settings_of(stack))
    jobs = [JobSubmit(id=f"s-q{i}", job_id=f"q{i}", demand=Demand(kind="mig", profile="1g.5gb"), tenant="team",
                      duration_hint_s=1.5, submitted_at=time.time()) for i in range(JOBS)]
    ids = [j.job_id for j in jobs]
    peak = 0
    try:
        await asyncio.gather(*(bus.publish(bus.subjects.jobs_submit, j) for j in jobs))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            recs = await state.jobs(ids)
            active = sum(1 for r in recs if r is not None and r.state in ACTIVE_STATES)
            peak = max(peak, active)
            if all(r is not None and r.state == "finished" for r in recs):
                break
            await asyncio.sleep(0.02)
    finally:
        await bus.close()
        await state.close()
    assert 0 < peak <= QUOTA, f"{peak} of the tenant's 1g jobs were active at once; its quota is {QUOTA}"
    assert_accounted(await converge(stack, ids, timeout=60), ids)
