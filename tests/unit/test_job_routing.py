"""Which shard a new job lives in (``services/balancer/routing.py``): its home (crc32 of its id) whenever some
set of the home's GPUs could host it, else the shard that can with the most empty GPUs, else its home again
(where it is rejected, with the reason)."""

from __future__ import annotations

import pytest

from services.balancer.routing import never_here, route_for
from services.balancer.shards import Shards
from services.balancer.tenancy import TenantLedger
from shared.events import JobSubmit
from shared.events.jobs import Topology, Workload
from shared.mig.geometry import default_geometry
from shared.policy.request import Demand
from shared.policy.reservation import ReservationParams
from shared.state import StoredGpu, StoredInstance, shard_of

pytestmark = pytest.mark.unit
GEO = default_geometry()


def cluster(*shards: dict[str, tuple[int, int, bool]]) -> Shards:
    """Shards of nodes: ``{node: (GPUs, of them busy, in MIG mode)}`` each; a node's block is its name's first
    letter."""
    out = Shards(len(shards), GEO, ReservationParams(), TenantLedger("", 0))
    for s, nodes in enumerate(shards):
        for node, (gpus, busy, mig) in nodes.items():
            out.labels[node] = {"block": node[0]}
            for i in range(gpus):
                busy_gpu = i < busy and not mig
                insts = ([StoredInstance(id=f"{node}/{i}:gpu", profile="gpu", start=0, size=8, compute=7,
                                         state="running", job=f"j-{node}-{i}", mig=False)] if busy_gpu else [])
                out.mirrors[s].put(StoredGpu(id=f"{node}/{i}", node=node, index=i, model="A100-40GB", mig=mig,
                                             instances=insts))
    return out


def gang(gpus: int, **kw: object) -> JobSubmit:
    return JobSubmit(id="s", job_id="g", demand=Demand(kind="gpus", gpus=gpus), submitted_at=0.0, **kw)  # type: ignore[arg-type]


def test_a_job_its_home_can_host_stays_there_whatever_the_other_shards_hold() -> None:
    shards = cluster({"a1": (8, 8, False)}, {"b1": (8, 0, False), "b2": (8, 0, False)})
    assert route_for(shards, gang(8), 0) is None  # busy now, but it fits: it waits at home


def test_a_gang_bigger_than_its_home_goes_to_the_shard_with_the_most_empty_gpus_that_can_host_it() -> None:
    shards = cluster({"a1": (4, 0, False)},
                     {"b1": (8, 6, False), "b2": (8, 0, False)},
                     {"c1": (8, 0, False), "c2": (8, 0, False)},
                     {"d1": (4, 0, False)})
    assert route_for(shards, gang(12), 0) == 2  # shard 1 holds 16 GPUs too, but 6 of them run jobs
    assert route_for(shards, gang(24), 0) is None  # no shard can: it is rejected at home
    assert never_here(shards, 0, gang(24)) == ("needs 24 GPUs; the largest shard has 16 "
                                               "(a gang runs within one shard)")


def test_a_job_whose_home_holds_no_gpu_goes_where_there_are_some() -> None:
    shards = cluster({}, {"b1": (2, 2, False)}, {"c1": (2, 0, False)})
    one = JobSubmit(id="s", job_id="j", demand=Demand(kind="gpus", gpus=1), submitted_at=0.0)
    assert route_for(shards, one, 0) == 2
    assert route_for(cluster({}, {}), one, 0) is None  # nothing registered anywhere yet: nothing to choose


def test_a_per_node_gang_goes_to_a_shard_with_enough_gpus_out_of_mig_mode() -> None:
    shards = cluster({"a1": (8, 0, True)}, {"b1": (8, 0, False)})
    per_node = gang(8, workload=Workload(launch="per-node"))
    assert route_for(shards, per_node, 0) == 1
    assert route_for(shards, gang(8), 0) is None  # per GPU, its home's MIG GPUs do


def test_a_gang_that_requires_one_block_goes_to_a_shard_holding_a_block_big_enough() -> None:
    shards = cluster({"a1": (4, 0, False), "x1": (4, 0, False)}, {"b1": (4, 0, False), "b2": (4, 0, False)})
    required = gang(8, topology=Topology(level="block", mode="required"))
    assert route_for(shards, required, 0) == 1  # home's 8 GPUs are in two blocks of 4
    preferred = gang(8, topology=Topology(level="block", mode="preferred"))
    assert route_for(shards, preferred, 0) is None


def test_what_a_process_learnt_of_a_job_is_read_again_once_it_is_old_or_crowded_out() -> None:
    from shared.state.job_routes import JobShards

    now = [0.0]
    learnt = JobShards(2, limit=10, for_s=60.0, clock=lambda: now[0])
    learnt.learn("a", 1)
    assert learnt.shard("a") == 1 and learnt.unknown(["a", "b", "a"]) == ["b"]
    now[0] = 61.0
    assert learnt.unknown(["a"]) == ["a"] and learnt.shard("a") == shard_of("a", 2)  # home asks again
    for n in range(11):
        learnt.learn(f"j{n}", 0)
    assert learnt.unknown(["a", "j10"]) == ["a"]  # the oldest went first
    assert JobShards(1).unknown(["a"]) == []  # one shard: every job lives in it


def test_a_per_node_gang_no_shard_has_enough_plain_gpus_for_stays_home_and_says_so() -> None:
    shards = cluster({"a1": (8, 0, True)}, {"b1": (4, 0, False), "b2": (4, 0, True)})
    per_node = gang(8, workload=Workload(launch="per-node"))
    assert route_for(shards, per_node, 0) is None
    assert never_here(shards, 0, per_node) == ("launch per-node needs 8 GPUs not in MIG mode (a process sees one "
                                               "MIG device); no shard has as many (the most: 4)")
    assert never_here(shards, 0, gang(4, workload=Workload(launch="per-node"))) == (
        "launch per-node needs 4 GPUs not in MIG mode (a process sees one MIG device); its shard 0 has 0")


def job(demand: Demand) -> JobSubmit:
    return JobSubmit(id="s", job_id="j", demand=demand, submitted_at=0.0)


def test_a_mig_request_or_a_share_no_gpu_here_could_ever_take_is_refused_with_the_reason() -> None:
    plain = cluster({"a1": (4, 0, False)})
    assert never_here(plain, 0, job(Demand(kind="mig", profile="3g"))) == "3g needs a GPU in MIG mode; none here is"
    assert never_here(plain, 0, job(Demand(kind="shared"))) == (
        "a time-sliced share needs a GPU not in MIG mode, time-sliced (MIGSCHED_EXECUTOR_GPUS ...:shared=N); none "
        "here is")
    mig = cluster({"m1": (2, 0, True)})
    assert never_here(mig, 0, job(Demand(kind="mig", profile="3g"))) is None
    assert never_here(mig, 0, job(Demand(kind="mig", profile="3g.40gb"))) == (
        "no GPU model in MIG mode here (A100-40GB) has a profile for 3g.40gb")
    assert never_here(cluster({}), 0, job(Demand(kind="mig", profile="3g"))) is None  # nothing registered yet
    # a GPU that changes mode when its node registers again changes the answer
    mig.mirrors[0].put(StoredGpu(id="m1/0", node="m1", index=0, model="A100-40GB", mig=False, replicas=2))
    assert never_here(mig, 0, job(Demand(kind="shared"))) is None


def test_a_mig_request_its_home_cannot_take_goes_to_a_shard_with_gpus_in_mig_mode() -> None:
    shards = cluster({"a1": (4, 0, False)}, {"b1": (2, 0, True)})
    assert route_for(shards, job(Demand(kind="mig", profile="1g.5gb")), 0) == 1
