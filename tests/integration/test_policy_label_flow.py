"""The balancer on real NATS and Redis, run with a policy label (``MIGSCHED_POLICY=migsched[keep_empty=0]``):
it places with the label's parameters, through its mirror's index as with the default."""

from __future__ import annotations

import pytest

from shared.events import Demand, JobSubmit, now
from tests.integration.test_balancer_flow import until
from tests.integration.test_balancer_holds import one_node, running_gpu

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def submit(job: str, profile: str) -> JobSubmit:
    return JobSubmit(id=f"s-{job}", job_id=job, demand=Demand(kind="mig", profile=profile), duration_hint_s=1000.0,
                     submitted_at=now())


@pytest.mark.parametrize(("policy", "together"), [("migsched", True), ("migsched[keep_empty=0]", False)])
async def test_a_balancer_told_to_spread_puts_a_second_small_job_on_the_empty_gpu(
    prefix: str, nats_url: str, redis_url: str, policy: str, together: bool
) -> None:
    async with one_node(prefix, nats_url, redis_url, 2, policy=policy) as (ns, _):
        gpu_of = running_gpu(ns)
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("a", "3g.20gb"))
        assert await until(lambda: gpu_of("a"))
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("b", "2g.10gb"))
        assert await until(lambda: gpu_of("b"))
        # the default packs the 2g beside the 3g; spreading opens the empty GPU while one is empty
        assert (await gpu_of("b") == await gpu_of("a")) is together
