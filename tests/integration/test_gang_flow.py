"""Gangs across nodes through the live services on real NATS + Redis, with scripted executors: one reservation
over every node, running once every member started, a completed part freeing its GPUs, the first failure or a
preemption stopping the other parts, rejection of a gang bigger than the cluster, two balancers racing, MIG
members, topology domains, and nodes of both kinds of GPU (which shard a gang lives in is test_shard_routing's)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from plain_cluster import GANG_TENANCY, GEO, Env, in_blocks, mirror_has, scripted_cluster, submit, until

from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings
from shared.bus import Outgoing
from shared.events import Demand, JobSubmit, Topology, now
from shared.state import audit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
WHOLE2 = {"gpus": 2, "plain": {0: 0, 1: 0}}
"""A node of two whole (non-MIG) GPUs."""


async def test_a_gang_across_mig_nodes_runs_on_full_size_instances_once_every_member_started(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    mig_only = {"gpus": 2}
    async with scripted_cluster(prefix, nats_url, redis_url, {"n1": mig_only, "n2": mig_only}) as e:
        nodes = e.nodes
        await e.submit(submit("mg", Demand(kind="gpus", gpus=3)))
        assert await until(e.all_in(["mg"], "running"))
        cmds = [c for ex in nodes for c in ex.commands("place") if c.job_id == "mg"]
        assert sorted(len(c.mig_members) for c in cmds) == [1, 2] and all(c.gang for c in cmds)
        job = await e.ns.state.job("mg")
        assert job is not None and len(job.slots) == 3
        gpus = await e.ns.state.get_gpus([g for g, _ in job.slots])
        assert all(g and [(i.profile, i.state, i.mig) for i in g.instances] == [("7g.40gb", "busy", False)]
                   for g in gpus)  # a member never moves on its own
        for ex in nodes:
            await ex.exit(["mg"])
        assert await until(e.all_in(["mg"], "finished"))
        await e.clean()


@pytest.fixture
async def two_plain_nodes(prefix: str, nats_url: str, redis_url: str) -> AsyncIterator[Env]:
    async with scripted_cluster(prefix, nats_url, redis_url, {"n1": WHOLE2, "n2": WHOLE2}) as e:
        yield e


async def test_a_gang_bigger_than_every_node_runs_across_nodes_once_every_member_started(
    two_plain_nodes: Env,
) -> None:
    e = two_plain_nodes
    n1, n2 = e.nodes
    n2.auto_ack = False  # n2 holds its command: the gang must wait for it
    await e.submit(submit("big", Demand(kind="gpus", gpus=3)))
    assert await n2.wait_for(lambda: bool(n2.commands("place")))
    assert await until(lambda: _started_on(e, "big", n1))
    assert await e.states(["big"]) == {"big": "placing"}  # one member started, the other not yet
    (c1,) = [c for c in n1.commands("place") if c.job_id == "big"]
    (c2,) = n2.commands("place")
    assert c1.gang is not None and c2.gang is not None
    parts = sorted([(c1.gang.node_rank, c1.gang.first_rank, len(c1.plain), c1.node),
                    (c2.gang.node_rank, c2.gang.first_rank, len(c2.plain), c2.node)])
    assert parts[0][:2] == (0, 0) and parts[1][:2] == (1, parts[0][2]) and parts[0][2] + parts[1][2] == 3
    assert c1.gang.world_size == 3 and c1.gang.hosts == c2.gang.hosts and len(c1.gang.hosts) == 2
    assert c1.cmd_id != c2.cmd_id and {c1.cmd_id[-2:], c2.cmd_id[-2:]} == {"/0", "/1"}
    await e.ns.bus.publish_batch(n2.reply(c2))
    assert await until(e.all_in(["big"], "running"))
    await e.clean()
    await n1.exit(["big"])  # one part completed: its GPUs free, the job runs on
    assert await until(lambda: _holds_none_on(e, "big", "n1"))
    assert await e.states(["big"]) == {"big": "running"}
    await e.clean()
    await n2.exit(["big"])
    assert await until(e.all_in(["big"], "finished"))
    await e.clean()


async def test_the_first_failed_member_stops_the_other_parts_and_fails_the_gang(two_plain_nodes: Env) -> None:
    e = two_plain_nodes
    n1, n2 = e.nodes
    await e.submit(submit("big", Demand(kind="gpus", gpus=4)))
    assert await until(e.all_in(["big"], "running"))
    await n1.exit(["big"], kind="failed")
    assert await until(e.all_in(["big"], "failed"))
    assert await n2.wait_for(lambda: any(c.job_id == "big" for c in n2.commands("stop")))
    assert await until(lambda: _holds_none_on(e, "big", "n2"))  # the stop's confirmation freed its GPUs
    await e.clean()
    await e.submit(submit("after", Demand(kind="gpus", gpus=4)))  # the whole cluster is free again
    assert await until(e.all_in(["after"], "running"))


async def test_a_member_node_that_comes_back_without_its_part_stops_the_others_and_re_queues_the_gang(
    two_plain_nodes: Env,
) -> None:
    e = two_plain_nodes
    n1, n2 = e.nodes
    await e.submit(submit("big", Demand(kind="gpus", gpus=4)))
    assert await until(e.all_in(["big"], "running"))
    n2.running.clear()  # n2 restarted and lost the run
    await n2.register()
    assert await n1.wait_for(lambda: any(c.job_id == "big" for c in n1.commands("stop")))
    history = await e.ns.state.history("big")
    assert any(h.prev == "running" and h.to == "pending" for h in history)
    assert await until(e.all_in(["big"], "running"))  # placed again once n1's part confirmed its stop
    await e.clean()


async def test_a_gang_bigger_than_the_cluster_is_rejected_at_submit_with_its_reason(two_plain_nodes: Env) -> None:
    e = two_plain_nodes
    await e.submit(submit("huge", Demand(kind="gpus", gpus=5)))
    assert await until(e.all_in(["huge"], "rejected"))
    job = await e.ns.state.job("huge")
    assert job is not None and "needs 5 GPUs; the cluster has 4" in job.reason
    gpus = await e.ns.state.get_gpus([f"{n}/{i}" for n in ("n1", "n2") for i in range(2)])
    assert not any(g.instances for g in gpus)
    await e.clean()


async def _started_on(e: Env, job: str, ex: ScriptedExecutor) -> bool:
    gpus = await e.ns.state.get_gpus([f"{ex.node}/{i}" for i in range(ex.gpus)])
    return any(i.job == job and i.state == "busy" for g in gpus if g for i in g.instances)


async def _holds_none_on(e: Env, job: str, node: str) -> bool:
    gpus = await e.ns.state.get_gpus([f"{node}/{i}" for i in range(2)])
    return not any(i.job == job for g in gpus if g for i in g.instances)


async def test_two_balancers_racing_a_16_gpu_gang_and_small_jobs_never_double_book(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        a, b = Stack(prefix, nats_url, redis_url, batch=4), Stack(prefix, nats_url, redis_url, batch=4)
        await a.start()
        await b.start()
        nodes = [ScriptedExecutor(ns.bus, f"n{i}", gpus=4, plain=dict.fromkeys(range(4), 0)) for i in range(4)]
        for ex in nodes:
            await ex.start()
        assert await until(lambda: mirror_has(a, 16)) and await until(lambda: mirror_has(b, 16))
        smalls = [f"s{i}" for i in range(24)]
        subs = [submit(j, Demand(kind="gpus", gpus=1 + i % 2)) for i, j in enumerate(smalls)]
        subs.insert(6, submit("gang", Demand(kind="gpus", gpus=16)))
        await ns.bus.publish_batch([Outgoing(ns.bus.subjects.jobs_submit, x) for x in subs])
        everyone = ["gang", *smalls]

        async def settled() -> bool:
            st = await Env(ns, a, nodes[0]).states(everyone)
            return len(st) == len(everyone) and "placing" not in st.values()

        assert await until(settled, 20)
        assert [str(v) for v in await audit(ns.state, GEO)] == []
        gpus = await ns.state.get_gpus([f"n{i}/{k}" for i in range(4) for k in range(4)])
        assert all(len(g.instances) <= 1 for g in gpus if g)  # a whole GPU holds one job at most

        async def gang_runs() -> bool:  # small jobs end; the gang's reservation lets it start once all is free
            for ex in nodes:
                done = [j for j in ex.running if j != "gang"]
                if done:
                    await ex.exit(done)
            return (await Env(ns, a, nodes[0]).states(["gang"])) == {"gang": "running"}

        assert await until(gang_runs, 30)
        assert [str(v) for v in await audit(ns.state, GEO)] == []
        for ex in nodes:
            await ex.stop()
        await b.stop()
        await a.stop()


@pytest.fixture
async def tenant_pair(prefix: str, nats_url: str, redis_url: str, tmp_path: Path) -> AsyncIterator[Env]:
    """Two nodes of two whole GPUs under a tenancy file: a low-priority ``team`` and an ``urgent`` tenant."""
    (tmp_path / "tenancy.toml").write_text(GANG_TENANCY)
    async with scripted_cluster(prefix, nats_url, redis_url, {"n1": WHOLE2, "n2": WHOLE2},
                                tenancy_file=str(tmp_path / "tenancy.toml")) as e:
        yield e


async def test_a_gang_across_nodes_preempted_for_an_urgent_job_is_stopped_on_every_node(tenant_pair: Env) -> None:
    e = tenant_pair
    nodes = e.nodes
    await e.submit(submit("gang", Demand(kind="gpus", gpus=4), tenant="team"))
    assert await until(e.all_in(["gang"], "running"))
    await e.submit(submit("hi", Demand(kind="gpus", gpus=2), tenant="urgent"))
    assert await until(e.all_in(["hi"], "running"))
    assert (await e.states(["gang"])) == {"gang": "pending"}  # re-queued, whole
    (hi,) = [c for ex in nodes for c in ex.commands("place") if c.job_id == "hi"]
    other = next(ex for ex in nodes if ex.node != hi.node)
    assert hi.stop_jobs == ("gang",)  # stopped where the urgent job goes, by its place command
    assert any(c.job_id == "gang" for c in other.commands("stop"))  # and by a stop on the other node
    await e.clean()


async def test_a_preempted_gangs_part_whose_stop_was_lost_is_stopped_again_and_only_that_run(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    (tmp_path / "tenancy.toml").write_text(GANG_TENANCY)
    async with scripted_cluster(prefix, nats_url, redis_url, {"n1": WHOLE2, "n2": WHOLE2}, cmd_timeout_s=2.0,
                                tenancy_file=str(tmp_path / "tenancy.toml")) as e:
        await e.submit(submit("gang", Demand(kind="gpus", gpus=4), tenant="team"))
        assert await until(e.all_in(["gang"], "running"))
        part = {ex.node: ex.running["gang"].cmd_id for ex in e.nodes}
        for ex in e.nodes:
            ex.lose_stop.add("gang")  # the stop of its part on the node the urgent job does not go to
        await e.submit(submit("hi", Demand(kind="gpus", gpus=2), tenant="urgent"))
        assert await until(e.all_in(["hi"], "running"))
        assert (await e.states(["gang"])) == {"gang": "pending"}
        other = next(ex for ex in e.nodes if "gang" in ex.running)
        assert "gang" not in other.lose_stop  # its stop came, and was lost

        async def beat_until_stopped() -> bool:
            for _ in range(80):
                if other.commands("stop"):
                    return True
                for ex in e.nodes:
                    await ex.heartbeat()
                await asyncio.sleep(0.1)
            return False

        assert await beat_until_stopped()
        [stop] = other.commands("stop")
        assert (stop.job_id, stop.src_cmd_id) == ("gang", part[other.node])
        assert await until(lambda: _stopped(other, "gang"))
        assert (await e.states(["gang", "hi"])) == {"gang": "pending", "hi": "running"}
        await e.clean()


async def _stopped(ex: ScriptedExecutor, job: str) -> bool:
    return job not in ex.running


def _gang(job: str, gpus: int, topology: Topology, tenant: str = "default") -> JobSubmit:
    return JobSubmit(id=f"s-{job}", job_id=job, tenant=tenant, demand=Demand(kind="gpus", gpus=gpus),
                     topology=topology, submitted_at=now())


async def test_a_gang_that_requires_one_block_lands_in_one_or_waits_with_its_reason(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with scripted_cluster(prefix, nats_url, redis_url, in_blocks({"n1": "b1", "n2": "b2", "n3": "b2"})) as e:
        block = Topology(level="block", mode="required")
        await e.submit(_gang("four", 4, block))
        assert await until(e.all_in(["four"], "running"))
        job = await e.ns.state.job("four")
        assert job is not None and {g.rpartition("/")[0] for g, _ in job.slots} == {"n2", "n3"}  # only b2 holds 4
        await e.submit(_gang("three", 3, block))
        assert await until(e.all_in(["three"], "pending"))
        job = await e.ns.state.job("three")
        assert job is not None and "no block holds the gang now" in job.reason
        await e.submit(_gang("five", 5, block))
        assert await until(e.all_in(["five"], "rejected"))
        job = await e.ns.state.job("five")
        assert job is not None and "needs 5 GPUs within one block; the largest block has 4" in job.reason
        await e.submit(_gang("loose", 2, Topology(level="rack")))  # no rack labels: anywhere
        assert await until(e.all_in(["loose"], "running"))
        await e.clean()


async def test_an_urgent_gang_preempts_the_cheapest_jobs_on_several_nodes(tenant_pair: Env) -> None:
    e = tenant_pair
    small = [f"w{i}" for i in range(4)]
    await e.submit(*(submit(j, Demand(kind="gpus", gpus=1), tenant="team") for j in small))
    assert await until(e.all_in(small, "running"))
    await e.submit(submit("urgent-gang", Demand(kind="gpus", gpus=3), tenant="urgent"))
    assert await until(e.all_in(["urgent-gang"], "running"))
    states = await e.states(small)
    assert sorted(states.values()) == ["pending", "pending", "pending", "running"]  # the fewest victims
    job = await e.ns.state.job("urgent-gang")
    assert job is not None and len({g.rpartition("/")[0] for g, _ in job.slots}) == 2
    await e.clean()


async def test_an_urgent_gang_that_requires_one_block_preempts_within_one(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    (tmp_path / "tenancy.toml").write_text(GANG_TENANCY)
    blocks = {"n1": "b1", "n2": "b2", "n3": "b1", "n4": "b2"}
    async with scripted_cluster(prefix, nats_url, redis_url, in_blocks(blocks, gpus=1),
                                tenancy_file=str(tmp_path / "tenancy.toml")) as e:
        where: dict[str, str] = {}
        for i in range(4):  # one at a time: the later a job started, the less work its preemption loses
            await e.submit(submit(f"w{i}", Demand(kind="gpus", gpus=1), tenant="team"))
            assert await until(e.all_in([f"w{i}"], "running"))
            job = await e.ns.state.job(f"w{i}")
            assert job is not None
            where[f"w{i}"] = job.node
        # the two cheapest victims (w2, w3) are in different blocks: only preemption within one block is legal
        assert blocks[where["w2"]] != blocks[where["w3"]]
        await e.submit(_gang("u", 2, Topology(level="block", mode="required"), tenant="urgent"))
        assert await until(e.all_in(["u"], "running"))
        job = await e.ns.state.job("u")
        assert job is not None and len({blocks[g.rpartition("/")[0]] for g, _ in job.slots}) == 1
        await e.clean()


async def test_on_nodes_of_both_kinds_a_gang_more_than_one_kind_of_a_node_spans_nodes_and_a_larger_one_is_refused(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    mixed = {"gpus": 8, "plain": dict.fromkeys(range(4), 0)}  # four GPUs not in MIG mode, four in MIG mode
    async with scripted_cluster(prefix, nats_url, redis_url, {"n1": mixed, "n2": mixed}) as e:
        await e.submit(submit("six", Demand(kind="gpus", gpus=6)))  # 8 GPUs a node, but a gang never mixes kinds
        assert await until(e.all_in(["six"], "running"))
        job = await e.ns.state.job("six")
        assert job is not None and {g.rpartition("/")[0] for g, _ in job.slots} == {"n1", "n2"}
        await e.submit(submit("twelve", Demand(kind="gpus", gpus=12)))  # 16 GPUs, at most 8 of one kind
        assert await until(e.all_in(["twelve"], "rejected"))
        job = await e.ns.state.job("twelve")
        assert job is not None and "needs 12 GPUs of one kind; the cluster has 16, at most 8 of one kind" in job.reason
        await e.clean()
