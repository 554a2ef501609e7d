"""Where a large new job that no shard can place now waits (``routing.sooner_elsewhere``): the shard where it is
expected to start soonest, after the running jobs' hinted ends and the large jobs queued ahead of it there, so
that large jobs arriving together spread over the shards rather than all queue where GPUs free first (the
balancer's side, a job joining the backlog of the shard it is sent to within the same round, is
``tests/integration/test_shard_routing.py``'s)."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest

from services.balancer.routing import expected_start, sooner_elsewhere
from services.balancer.shards import Shards
from services.balancer.tenancy import TenantLedger
from shared.events import JobSubmit
from shared.events.jobs import Topology
from shared.mig.geometry import default_geometry
from shared.policy.request import Demand
from shared.policy.reservation import ReservationParams
from shared.state import StoredGpu, StoredInstance, shard_of

pytestmark = pytest.mark.unit
GEO = default_geometry()
NOW = 1000.0


def cluster(*shards: dict[str, tuple[int, float]]) -> Shards:
    """Shards of nodes of whole GPUs: ``{node: (GPUs, seconds until each one's job ends, 0: idle)}``; a node's
    block is its name's first letter."""
    out = Shards(len(shards), GEO, ReservationParams(), TenantLedger("", 0))
    for s, nodes in enumerate(shards):
        for node, (gpus, left) in nodes.items():
            out.labels[node] = {"block": node[:2]}
            for i in range(gpus):
                insts = ([StoredInstance(id=f"{node}/{i}:gpu", profile="gpu", start=0, size=8, compute=7,
                                         state="running", job=f"r-{node}-{i}", mig=False, ends=NOW + left)]
                         if left else [])
                out.mirrors[s].put(StoredGpu(id=f"{node}/{i}", node=node, index=i, model="A100-40GB", mig=False,
                                             instances=insts))
    return out


def job(job_id: str, gpus: int, hint_s: float | None = 600.0, **kw: object) -> JobSubmit:
    return JobSubmit(id=f"s-{job_id}", job_id=job_id, demand=Demand(kind="gpus", gpus=gpus), duration_hint_s=hint_s,
                     submitted_at=NOW, **kw)  # type: ignore[arg-type]


def test_a_large_job_goes_where_the_gpus_free_sooner_and_stays_home_when_home_is_as_soon() -> None:
    shards = cluster({"a1": (8, 3600.0)}, {"b1": (8, 60.0)})
    assert expected_start(shards, 0, job("g", 8), NOW) == NOW + 3600.0
    assert sooner_elsewhere(shards, 0, job("g", 8), NOW) == 1
    assert sooner_elsewhere(shards, 1, job("g", 8), NOW) is None
    even = cluster({"a1": (8, 60.0)}, {"b1": (8, 60.5)})
    assert sooner_elsewhere(even, 1, job("g", 8), NOW) is None  # half a second is within the hints' noise


def test_a_small_job_or_one_with_no_known_start_anywhere_stays_home() -> None:
    shards = cluster({"a1": (8, 3600.0)}, {"b1": (8, 60.0)})
    small = JobSubmit(id="s", job_id="m", demand=Demand(kind="mig", profile="1g.5gb"), submitted_at=NOW)
    assert sooner_elsewhere(shards, 0, small, NOW) is None
    unhinted = cluster({"a1": (8, 0.0)}, {"b1": (8, 0.0)})
    for s in range(2):  # every GPU runs a job without a hint
        for g in unhinted.mirrors[s].view().gpus:
            insts = [StoredInstance(id=f"{g.id}:gpu", profile="gpu", start=0, size=8, compute=7, state="running",
                                    job="x", mig=False)]
            unhinted.mirrors[s].put(StoredGpu(id=g.id, node=g.node, index=g.index, model="A100-40GB", mig=False,
                                              instances=insts))
    assert sooner_elsewhere(unhinted, 0, job("g", 8), NOW) is None


def test_large_jobs_arriving_together_spread_over_the_shards_by_the_queue_ahead_of_them() -> None:
    shards = cluster({"a1": (8, 600.0)}, {"b1": (8, 60.0)})
    models = shards.mirrors[0].view().model_list
    first = job("first", 8, hint_s=3600.0)
    assert sooner_elsewhere(shards, 0, first, NOW) == 1
    shards.backlogs[1].queued(first, models)  # it waits there: starts in 60 s, runs an hour
    assert expected_start(shards, 1, job("second", 8), NOW) == NOW + 60.0 + 3600.0
    assert sooner_elsewhere(shards, 1, job("second", 8), NOW) == 0  # behind it, shard 0's GPUs free sooner
    shards.backlogs[1].left("first")
    assert expected_start(shards, 1, job("second", 8), NOW) == NOW + 60.0


def test_a_job_ahead_with_no_hint_leaves_no_known_start_behind_it() -> None:
    shards = cluster({"a1": (8, 600.0)}, {"b1": (8, 60.0)})
    shards.backlogs[1].queued(job("open-ended", 8, hint_s=None), shards.mirrors[1].view().model_list)
    assert expected_start(shards, 1, job("g", 8), NOW) == float("inf")
    assert sooner_elsewhere(shards, 1, job("g", 8), NOW) == 0


def test_a_gang_kept_within_one_block_is_timed_on_the_block_that_frees_first() -> None:
    shards = cluster({"a1n1": (4, 900.0), "a1n2": (4, 900.0), "a2n1": (4, 60.0), "a2n2": (4, 3600.0)},
                     {"b1n1": (4, 300.0), "b1n2": (4, 300.0)})
    within = job("g", 8, topology=Topology(level="block", mode="required"))
    assert expected_start(shards, 0, within, NOW) == NOW + 900.0  # block a1; a2 frees its last GPUs in an hour
    assert sooner_elsewhere(shards, 0, within, NOW) == 1
    assert expected_start(shards, 0, job("loose", 8), NOW) == NOW + 900.0  # anywhere: the same 8 soonest


def balancer_of(*shards: tuple[str, int, float | None], now: float) -> Any:
    """A balancer of one node per shard on memory twins: ``(node, GPUs, seconds until its jobs end)`` each, its
    GPUs not in MIG mode and all busy (None: all empty). The GPUs are in its mirrors only: where each job is sent
    and queued is decided, its placement is not committed."""
    from services.balancer.service import Balancer
    from shared.bus import MemoryBus
    from shared.settings import BalancerSettings, load
    from shared.state.memory_store import MemoryState

    st = load(BalancerSettings, env={}, namespace="t", shards=len(shards), metrics_port=0)
    balancer = Balancer(st, MemoryBus(st), MemoryState(shards=len(shards)))
    for s, (node, gpus, left) in enumerate(shards):
        for i in range(gpus):
            insts = [] if left is None else [StoredInstance(
                id=f"{node}/{i}:gpu", profile="gpu", start=0, size=8, compute=7, state="running",
                job=f"r-{node}-{i}", mig=False, ends=now + left)]
            balancer.shards.mirrors[s].put(StoredGpu(id=f"{node}/{i}", node=node, index=i, model="A100-40GB",
                                                     mig=False, instances=insts))
    return balancer


def fresh(job_id: str, gpus: int, hint_s: float, now: float) -> Any:
    from services.balancer.candidate import Candidate

    sub = JobSubmit(id=f"s-{job_id}", job_id=job_id, demand=Demand(kind="gpus", gpus=gpus), duration_hint_s=hint_s,
                    submitted_at=now)
    return Candidate(submit=sub, spec=msgspec.json.encode(sub), ctx=None)


def homed_in(shard: int, n: int) -> list[str]:
    return [j for j in (f"j{i}" for i in range(1000)) if shard_of(j, 2) == shard][:n]


async def test_the_balancer_sends_jobs_decided_in_one_round_where_each_starts_soonest_behind_the_ones_before() -> None:
    now = time.time()
    balancer = balancer_of(("slow", 2, 3600.0), ("quick", 2, 60.0), now=now)
    first, second = homed_in(0, 2)  # both at home in the slow shard
    await balancer.pipeline.run([fresh(first, 2, 7200.0, now), fresh(second, 2, 7200.0, now)])  # one round
    assert await balancer.state.all_job_ids(1) == [first]  # its GPUs free in a minute over there
    assert await balancer.state.all_job_ids(0) == [second]  # behind the first's two hours, home frees sooner


async def test_every_new_job_of_a_round_that_its_full_home_cannot_place_goes_where_there_is_room() -> None:
    now = time.time()
    balancer = balancer_of(("full", 2, 30.0), ("room", 2, None), now=now)
    jobs = homed_in(0, 3)
    await balancer.pipeline.run([fresh(j, 1, 600.0, now) for j in jobs])  # one round decides all three
    on_room = await balancer.state.all_job_ids(1)
    assert sorted(on_room) == sorted(jobs[:2])  # the room for two, not only the first of the round
    # no room left there for the third: it would start behind the other two's ten minutes, and its home frees
    # in half a minute
    assert await balancer.state.all_job_ids(0) == [jobs[2]]
