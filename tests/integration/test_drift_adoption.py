"""A node holding an instance the state does not know (a command that ran after its job was re-queued elsewhere)
refuses every placement that overlaps it. Its executor re-registers right after each refusal, and the registry
applies the refusal before the registration, whatever batch they arrive in: the registration then adopts the
instance as idle, the next placement destroys it on the way, and the job runs, instead of being sent to the same
slot until its attempts run out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from services.common.testing import with_sim_executor
from services.executor.service import Executor
from shared.client import MigschedClient
from shared.mig.geometry import default_geometry

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NODE = "drift-node"


@pytest.fixture
async def executor(prefix: str, nats_url: str, redis_url: str) -> AsyncIterator[Executor]:
    async with with_sim_executor(prefix, nats_url, redis_url, NODE) as ex:
        yield ex


async def test_a_job_refused_for_an_instance_the_state_did_not_know_still_runs(
    executor: Executor, prefix: str, nats_url: str, redis_url: str
) -> None:
    while not executor.book.models:
        await asyncio.sleep(0.05)
    # an instance on the node that no registration reported: the whole GPU's only 7g slot overlaps it
    one_g = default_geometry().model("A100-40GB").profile("1g.5gb")
    await executor.backend.create_instance(0, one_g.profile_id, 0)
    async with MigschedClient(nats_url, namespace=prefix, redis_url=redis_url) as client:
        job = await client.submit(profile="7g.40gb", duration_s=0.2)
        assert await client.wait(job, timeout=30) == "finished"
    # the adopted instance was destroyed on the 7g's way
    assert all(i.profile != "1g.5gb" for i in await executor.backend.list_instances(0))
