"""The Python client against the real services (in this process, on the real NATS and Redis) and a sim
executor: ``submit`` -> ``wait`` sees the job finish; ``cancel`` stops a running job; ``wait`` without Redis
learns the outcome from ``jobs.exit``; a wait that cannot succeed times out with a clear error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from services.common.testing import with_sim_executor
from services.executor.service import Executor
from shared.client import ClientError, MigschedClient, WaitTimeout

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NODE = "client-node"


@pytest.fixture
async def cluster(prefix: str, nats_url: str, redis_url: str) -> AsyncIterator[Executor]:
    async with with_sim_executor(prefix, nats_url, redis_url, NODE) as executor:
        yield executor


async def test_a_submitted_job_runs_and_wait_returns_when_it_finishes(
    cluster: Executor, prefix: str, nats_url: str, redis_url: str
) -> None:
    async with MigschedClient(nats_url, namespace=prefix, redis_url=redis_url) as c:
        job = await c.submit(compute_slices=2, memory_gb=8, tenant="team-a", duration_s=0.3)
        assert await c.wait(job, states={"running"}, timeout=20) == "running"
        assert await c.wait(job, timeout=20) == "finished"
        assert await c.state(job) == "finished"


async def test_cancel_stops_a_running_job(
    cluster: Executor, prefix: str, nats_url: str, redis_url: str
) -> None:
    async with MigschedClient(nats_url, namespace=prefix, redis_url=redis_url) as c:
        job = await c.submit(profile="7g", duration_s=3600)
        await c.wait(job, states={"running"}, timeout=20)
        assert job in cluster.backend.running()
        await c.cancel(job, "no longer needed")
        assert await c.wait(job, timeout=20) == "cancelled"

    async def gone() -> None:
        while job in cluster.backend.running():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(gone(), 10)


async def test_wait_without_redis_learns_the_outcome_from_jobs_exit(
    cluster: Executor, prefix: str, nats_url: str
) -> None:
    async with MigschedClient(nats_url, namespace=prefix) as c:
        job = await c.submit(profile="1g.5gb", duration_s=0.1)
        await asyncio.sleep(1.0)  # it has most likely ended already: the exit is read back from the stream
        assert await c.wait(job, timeout=20) == "finished"


async def test_a_wait_that_cannot_succeed_times_out_with_the_last_state(
    cluster: Executor, prefix: str, nats_url: str, redis_url: str
) -> None:
    async with MigschedClient(nats_url, namespace=prefix, redis_url=redis_url) as c:
        job = await c.submit(profile="3g", duration_s=3600)
        with pytest.raises(WaitTimeout, match=job):
            await c.wait(job, timeout=1.0)
        await c.cancel(job)


async def test_an_unconnected_client_says_so() -> None:
    c = MigschedClient("nats://127.0.0.1:1")
    with pytest.raises(ClientError, match="not connected"):
        await c.submit(profile="3g")
