"""A tenant's quota holds when balancer replicas decide from books a moment old (real NATS + Redis): the store
checks each reservation against its usage counters in the same step as the placement, so a placement that a
stale book allowed is refused and the job waits, saying why, until the quota has room again."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.state import Reservation, StoredInstance
from tests.integration.test_balancer_flow import until
from tests.integration.test_balancer_holds import one_node, running_gpu, submit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
THREE_G = {"compute_slices": 3.0, "memory_gib": 20.0, "nvidia.com/mig-3g.20gb": 1.0}


def quota_of_one_3g(folder: Path) -> str:
    path = folder / "tenancy.toml"
    path.write_text('[priority_classes.normal]\nvalue = 100\ndefault = true\n\n'
                    '[tenants.team]\nquota = { compute_slices = 3 }\n')
    return str(path)


async def test_a_placement_a_stale_book_allowed_is_refused_by_the_store_and_the_job_waits(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    async with one_node(prefix, nats_url, redis_url, 2, tenancy_file=quota_of_one_3g(tmp_path),
                        ) as (ns, stack):
        # another replica placed a 3g of the team on the second GPU; this balancer has not seen it
        (g1,) = await ns.state.get_gpus(["n1/1"])
        other = StoredInstance(id="n1/1:3g.20gb@4:other", profile="3g.20gb", start=4, size=4, compute=3,
                               tenant="team")
        res = await ns.state.reserve(
            Reservation(job_id="other", gpu_id="n1/1", expected_ver=g1.ver, instance=other, action="create",
                        max_count=2, spec=b"{}", tenant="team", usage=THREE_G), 0.0)
        assert res.ok, res
        assert stack.balancer.ledger.book.used("team") == {}

        # its book says the team uses nothing: it places a second 3g on the first GPU, which the store refuses
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("mine", "3g.20gb", 600.0, "team"))

        async def waiting() -> str:
            j = await ns.state.job("mine")
            return j.reason if j is not None and j.state == "pending" else ""

        assert await until(waiting)
        assert (await waiting()).startswith("quota: team would use 6 compute_slices")
        (g0,) = await ns.state.get_gpus(["n1/0"])
        assert [i.job for i in g0.instances if i.job] == []
        assert (await ns.state.tenant_usage(0))["team"]["compute_slices"] == 3.0

        # once the other job ends, the next pass places it: nothing was lost
        assert (await ns.state.release("other", "completed", "exit 0", 1.0, other.id)).status == "ok"
        await stack.balancer.backfill()
        assert await until(lambda: running_gpu(ns)("mine"))
        assert (await ns.state.tenant_usage(0))["team"]["compute_slices"] == 3.0
