"""Whole-GPU gangs and time-sliced shares through the live services (balancer, registry, node registry) on
real NATS + Redis, with scripted executors whose GPUs are not in MIG mode: a 2-GPU gang placed on one node and
finished, shares up to ``replicas`` on one GPU with the next one waiting, and a mixed cluster where MIG requests
never land on non-MIG GPUs and plain requests never on MIG GPUs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings
from shared.bus import Outgoing
from shared.events import Demand, JobSubmit, Topology, now
from shared.mig.geometry import default_geometry
from shared.state import RedisState, audit, shard_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
GEO = default_geometry()


def submit(job: str, demand: Demand, tenant: str = "default") -> JobSubmit:
    return JobSubmit(id=f"s-{job}", job_id=job, demand=demand, tenant=tenant, submitted_at=now())


async def until(pred: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await pred():
            return True
        await asyncio.sleep(0.05)
    return bool(await pred())


class Env:
    def __init__(self, ns: Namespace, stack: Stack, ex: ScriptedExecutor) -> None:
        self.ns, self.stack, self.ex = ns, stack, ex
        self.nodes = [ex]

    async def submit(self, *subs: JobSubmit) -> None:
        for s in subs:
            await self.ns.bus.publish(self.ns.bus.subjects.jobs_submit, s)

    async def states(self, jobs: list[str]) -> dict[str, str]:
        return {j.job_id: j.state for j in await self.ns.state.jobs(jobs) if j is not None}

    def all_in(self, jobs: list[str], state: str) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            got = await self.states(jobs)
            return len(got) == len(jobs) and set(got.values()) == {state}

        return check

    async def clean(self) -> None:
        assert [str(v) for v in await audit(self.ns.state, GEO)] == []


CLASSES = """
[priority_classes.low]
value = 10
preemption = "PreemptLowerPriority"

[priority_classes.high]
value = 900
preemption = "PreemptLowerPriority"

[tenants.urgent]
priority_class = "high"
"""
TENANCY = CLASSES + """
[tenants.team]
priority_class = "low"
quota = { "nvidia.com/gpu" = 2, "nvidia.com/gpu.shared" = 4 }
"""
GANG_TENANCY = CLASSES + """
[tenants.team]
priority_class = "low"
"""


def env_of(gpus: int, plain: dict[int, int], tenancy: bool = False) -> Callable[..., Any]:
    @pytest.fixture
    async def fixture(prefix: str, nats_url: str, redis_url: str, tmp_path: Path) -> AsyncIterator[Env]:
        extra: dict[str, Any] = {}
        if tenancy:
            (tmp_path / "tenancy.toml").write_text(TENANCY)
            extra = {"tenancy_file": str(tmp_path / "tenancy.toml")}
        async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
            stack = Stack(prefix, nats_url, redis_url, **extra)
            await stack.start()
            ex = ScriptedExecutor(ns.bus, "n1", gpus=gpus, plain=plain)
            await ex.start()
            e = Env(ns, stack, ex)
            assert await until(lambda: _mirror_has(stack, gpus))
            yield e
            await ex.stop()
            await stack.stop()

    return fixture


async def _mirror_has(stack: Stack, n: int) -> bool:
    return len(stack.balancer.mirrors[0]) >= n


plain_node = env_of(2, {0: 0, 1: 0})
shared_node = env_of(1, {0: 3})
mixed_node = env_of(4, {2: 0, 3: 2})
mig_pair_node = env_of(3, {2: 0})
tenant_node = env_of(4, {0: 0, 1: 0, 2: 0, 3: 2}, tenancy=True)


async def test_a_two_gpu_gang_is_placed_on_one_node_and_finished(plain_node: Env) -> None:
    e = plain_node
    await e.submit(submit("g1", Demand(kind="gpus", gpus=2)))
    assert await until(e.all_in(["g1"], "running"))
    (cmd,) = e.ex.commands("place")
    assert cmd.ops == () and len(cmd.plain) == 2 and {s.profile for s in cmd.plain} == {"gpu"}
    job = await e.ns.state.job("g1")
    assert job is not None and len(job.slots) == 2
    held = {g for g, _ in job.slots}
    assert held == {f"n1/{s.gpu_index}" for s in cmd.plain} and cmd.instance_id == job.inst
    await e.clean()
    # a second gang of 2 does not fit beside it: it waits for both GPUs
    await e.submit(submit("g2", Demand(kind="gpus", gpus=2)))
    assert await until(e.all_in(["g2"], "pending"))
    await e.ex.exit(["g1"])
    assert await until(e.all_in(["g1"], "finished"))
    assert await until(e.all_in(["g2"], "running"))  # backfilled onto the freed GPUs (the mirror saw both)
    gpus = await e.ns.state.get_gpus(["n1/0", "n1/1"])
    assert not any(i.job == "g1" for g in gpus for i in g.instances)  # every GPU of the gang was freed
    assert sum(1 for g in gpus for i in g.instances if i.job == "g2") == 2
    assert e.ex.commands("destroy_idle") == []  # retention ignores plain GPUs: nothing idle to destroy
    await e.clean()


async def test_shares_fill_the_replicas_of_one_gpu_and_the_next_waits(shared_node: Env) -> None:
    e = shared_node
    jobs = [f"s{n}" for n in range(4)]
    await e.submit(*(submit(j, Demand(kind="shared")) for j in jobs))
    assert await until(lambda: _count(e, jobs, "running", 3))
    states = await e.states(jobs)
    waiting = [j for j, s in states.items() if s == "pending"]
    assert len(waiting) == 1
    job = await e.ns.state.job(waiting[0])
    assert job is not None and "no time-sliced GPU has a free replica" in job.reason
    g = (await e.ns.state.get_gpus(["n1/0"]))[0]
    assert sorted(i.start for i in g.instances) == [0, 1, 2] and {i.profile for i in g.instances} == {"shared"}
    replicas = sorted(c.plain[0].replica for c in e.ex.commands("place"))
    assert replicas == [0, 1, 2]
    await e.clean()
    running = [j for j, s in states.items() if s == "running"]
    await e.ex.exit(running[:1])
    assert await until(e.all_in(waiting, "running"))
    await e.clean()


async def _count(e: Env, jobs: list[str], state: str, n: int) -> bool:
    return list((await e.states(jobs)).values()).count(state) == n


async def test_in_a_mixed_cluster_each_request_lands_on_its_own_kind_of_gpu(mixed_node: Env) -> None:
    e = mixed_node  # GPUs 0, 1 MIG; 2 whole-only; 3 time-sliced into 2
    mig = [f"m{n}" for n in range(4)]
    await e.submit(*(submit(j, Demand(kind="mig", profile="3g.20gb")) for j in mig))
    await e.submit(submit("w", Demand(kind="gpus", gpus=1)), submit("sa", Demand(kind="shared")),
                   submit("sb", Demand(kind="shared")))
    everyone = [*mig, "w", "sa", "sb"]
    assert await until(e.all_in(everyone, "running"))
    for job in await e.ns.state.jobs(everyone):
        assert job is not None
        gpu = int(job.gpu.rsplit("/", 1)[1])
        if job.job_id in mig:
            assert gpu in (0, 1), job
        elif job.job_id == "w":
            assert gpu == 2, job  # a dedicated GPU before a time-sliced one
        else:
            assert gpu == 3, job
    # everything is taken: one more of each kind waits, none spills onto the other kind of GPU
    await e.submit(submit("m9", Demand(kind="mig", profile="3g.20gb")), submit("s9", Demand(kind="shared")),
                   submit("w9", Demand(kind="gpus", gpus=1)))
    assert await until(e.all_in(["m9", "s9", "w9"], "pending"))
    await e.clean()


async def test_a_gang_that_fits_only_on_mig_gpus_runs_on_a_full_size_instance_of_each(mig_pair_node: Env) -> None:
    e = mig_pair_node  # GPUs 0, 1 MIG and empty; GPU 2 whole-only
    await e.submit(submit("g2", Demand(kind="gpus", gpus=2)))
    assert await until(e.all_in(["g2"], "running"))
    (gang,) = e.ex.commands("place")
    assert [(m.gpu_index, m.instance_id) for m in gang.mig_members] == [
        (0, "n1/0:7g.40gb@0:g2"), (1, "n1/1:7g.40gb@0:g2")]
    assert [(op.kind, op.gpu_id) for op in gang.ops if op.kind == "create_gi"] == [
        ("create_gi", "n1/0"), ("create_gi", "n1/1")]
    assert gang.gang is not None and gang.gang.world_size == 2 and gang.plain == ()
    await e.submit(submit("one", Demand(kind="gpus", gpus=1)))
    assert await until(e.all_in(["one"], "running"))
    assert (await e.ns.state.job("one")).gpu == "n1/2"  # type: ignore[union-attr]
    cmd = e.ex.commands("place")[-1]
    assert [s.gpu_index for s in cmd.plain] == [2] and cmd.ops == ()
    await e.ex.exit(["g2"])
    assert await until(e.all_in(["g2"], "finished"))
    await e.clean()


async def test_a_gang_across_mig_nodes_runs_on_full_size_instances_once_every_member_started(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url)
        await stack.start()
        nodes = [ScriptedExecutor(ns.bus, n, gpus=2) for n in ("n1", "n2")]  # MIG GPUs only
        for ex in nodes:
            await ex.start()
        e = Env(ns, stack, nodes[0])
        assert await until(lambda: _mirror_has(stack, 4))
        await e.submit(submit("mg", Demand(kind="gpus", gpus=3)))
        assert await until(e.all_in(["mg"], "running"))
        cmds = [c for ex in nodes for c in ex.commands("place") if c.job_id == "mg"]
        assert sorted(len(c.mig_members) for c in cmds) == [1, 2] and all(c.gang for c in cmds)
        job = await ns.state.job("mg")
        assert job is not None and len(job.slots) == 3
        gpus = await ns.state.get_gpus([g for g, _ in job.slots])
        assert all(g and [(i.profile, i.state, i.mig) for i in g.instances] == [("7g.40gb", "busy", False)]
                   for g in gpus)  # a member never moves on its own
        for ex in nodes:
            await ex.exit(["mg"])
        assert await until(e.all_in(["mg"], "finished"))
        await e.clean()
        for ex in nodes:
            await ex.stop()
        await stack.stop()
    await e.clean()


async def test_whole_gpus_are_charged_as_nvidia_com_gpu_against_the_quota(tenant_node: Env) -> None:
    e = tenant_node  # team may hold 2 whole GPUs; the node has 3 whole-only GPUs
    await e.submit(submit("g2", Demand(kind="gpus", gpus=2), "team"))
    assert await until(e.all_in(["g2"], "running"))
    assert e.stack.balancer.ledger.book.used("team")["nvidia.com/gpu"] == 2
    await e.submit(submit("g1", Demand(kind="gpus", gpus=1), "team"))
    assert await until(e.all_in(["g1"], "pending"))
    job = await e.ns.state.job("g1")
    assert job is not None and job.reason.startswith("quota")  # a GPU is free: only the quota holds it
    await e.ex.exit(["g2"])
    assert await until(e.all_in(["g1"], "running"))
    assert e.stack.balancer.ledger.book.used("team")["nvidia.com/gpu"] == 1
    await e.clean()


async def test_a_high_priority_share_preempts_a_low_priority_one(tenant_node: Env) -> None:
    e = tenant_node  # GPU 3 is time-sliced into 2; the whole GPUs take no shares
    await e.submit(submit("lo0", Demand(kind="shared"), "team"), submit("lo1", Demand(kind="shared"), "team"))
    assert await until(e.all_in(["lo0", "lo1"], "running"))
    assert e.stack.balancer.ledger.book.used("team")["nvidia.com/gpu.shared"] == 2
    await e.submit(submit("hi", Demand(kind="shared"), "urgent"))
    assert await until(e.all_in(["hi"], "running"))
    states = await e.states(["lo0", "lo1"])
    assert sorted(states.values()) == ["pending", "running"]
    victim = next(j for j, st in states.items() if st == "pending")
    rec = await e.ns.state.job(victim)
    assert rec is not None and rec.preempted == 1
    hist = await e.ns.state.history(victim)
    assert any(h.prev == "running" and h.to == "pending" and h.reason.startswith("preempted by hi") for h in hist)
    (cmd,) = [c for c in e.ex.commands("place") if c.job_id == "hi"]
    assert cmd.stop_jobs == (victim,) and cmd.plain[0].profile == "shared"
    g3 = (await e.ns.state.get_gpus(["n1/3"]))[0]
    assert sorted(i.job or "" for i in g3.instances) == sorted(["hi", next(j for j in states if j != victim)])
    await e.clean()


@pytest.fixture
async def two_plain_nodes(prefix: str, nats_url: str, redis_url: str) -> AsyncIterator[Env]:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url)
        await stack.start()
        nodes = [ScriptedExecutor(ns.bus, n, gpus=2, plain={0: 0, 1: 0}) for n in ("n1", "n2")]
        for ex in nodes:
            await ex.start()
        assert await until(lambda: _mirror_has(stack, 4))
        env = Env(ns, stack, nodes[0])
        env.nodes = nodes
        yield env
        for ex in nodes:
            await ex.stop()
        await stack.stop()


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
        assert await until(lambda: _mirror_has(a, 16)) and await until(lambda: _mirror_has(b, 16))
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



async def test_a_gang_across_nodes_preempted_for_an_urgent_job_is_stopped_on_every_node(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    (tmp_path / "tenancy.toml").write_text(GANG_TENANCY)
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, tenancy_file=str(tmp_path / "tenancy.toml"))
        await stack.start()
        nodes = [ScriptedExecutor(ns.bus, n, gpus=2, plain={0: 0, 1: 0}) for n in ("n1", "n2")]
        for ex in nodes:
            await ex.start()
        e = Env(ns, stack, nodes[0])
        assert await until(lambda: _mirror_has(stack, 4))
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
        for ex in nodes:
            await ex.stop()
        await stack.stop()


async def _labelled_nodes(ns: Namespace, spec: dict[str, str]) -> list[ScriptedExecutor]:
    nodes = [ScriptedExecutor(ns.bus, n, gpus=2, plain={0: 0, 1: 0}, labels={"block": b}) for n, b in spec.items()]
    for ex in nodes:
        await ex.start()
    return nodes


async def test_a_gang_that_requires_one_block_lands_in_one_or_waits_with_its_reason(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url)
        await stack.start()
        nodes = await _labelled_nodes(ns, {"n1": "b1", "n2": "b2", "n3": "b2"})
        e = Env(ns, stack, nodes[0])
        assert await until(lambda: _mirror_has(stack, 6))
        block = Topology(level="block", mode="required")
        four = JobSubmit(id="s-four", job_id="four", demand=Demand(kind="gpus", gpus=4), topology=block,
                         submitted_at=now())
        await e.submit(four)
        assert await until(e.all_in(["four"], "running"))
        job = await e.ns.state.job("four")
        assert job is not None and {g.rpartition("/")[0] for g, _ in job.slots} == {"n2", "n3"}  # only b2 holds 4
        three = JobSubmit(id="s-three", job_id="three", demand=Demand(kind="gpus", gpus=3), topology=block,
                          submitted_at=now())
        await e.submit(three)
        assert await until(e.all_in(["three"], "pending"))
        job = await e.ns.state.job("three")
        assert job is not None and "no block holds the gang now" in job.reason
        loose = JobSubmit(id="s-loose", job_id="loose", demand=Demand(kind="gpus", gpus=2),
                          topology=Topology(level="rack"), submitted_at=now())  # no rack labels: anywhere
        await e.submit(loose)
        assert await until(e.all_in(["loose"], "running"))
        await e.clean()
        for ex in nodes:
            await ex.stop()
        await stack.stop()


async def test_with_several_shards_a_blocks_nodes_share_its_shard_and_a_gang_fits_in_one_script(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    blocks = {"n1": "b1", "n2": "b1", "n3": "b2", "n4": "b2"}
    async with Namespace(make_settings(prefix, nats_url, redis_url, shards=4)) as ns:
        stack = Stack(prefix, nats_url, redis_url, shards=4)
        await stack.start()
        nodes = await _labelled_nodes(ns, blocks)
        assert await until(lambda: _mirrors_hold(stack, 8))
        fresh = RedisState.from_settings(make_settings(prefix, nats_url, redis_url, shards=4))
        try:
            await fresh.nodes()  # another process learns where each node lives from the shards themselves
            for node, block in blocks.items():
                assert fresh.node_shard(node) == shard_of(block, 4)
            for ex in nodes:  # heartbeats land on the node records in their block's shard
                await ex.heartbeat()
            seen = await fresh.nodes()
            assert sorted(seen) == sorted(blocks) and all(h.get("state") == "up" for h in seen.values())
        finally:
            await fresh.close()
        # a gang of four in the shard of b1's nodes (the job's shard is its id's)
        job_id = next(f"g{i}" for i in range(1000) if shard_of(f"g{i}", 4) == shard_of("b1", 4))
        await Env(ns, stack, nodes[0]).submit(submit(job_id, Demand(kind="gpus", gpus=4)))
        assert await until(Env(ns, stack, nodes[0]).all_in([job_id], "running"))
        job = await ns.state.job(job_id)
        assert job is not None and {g.rpartition("/")[0] for g, _ in job.slots} == {"n1", "n2"}
        assert [str(v) for v in await audit(ns.state, GEO)] == []
        for ex in nodes:
            await ex.stop()
        await stack.stop()


async def _mirrors_hold(stack: Stack, n: int) -> bool:
    return sum(len(m) for m in stack.balancer.mirrors) >= n


async def test_an_urgent_gang_preempts_the_cheapest_jobs_on_several_nodes(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    (tmp_path / "tenancy.toml").write_text(GANG_TENANCY)
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, tenancy_file=str(tmp_path / "tenancy.toml"))
        await stack.start()
        nodes = [ScriptedExecutor(ns.bus, n, gpus=2, plain={0: 0, 1: 0}) for n in ("n1", "n2")]
        for ex in nodes:
            await ex.start()
        e = Env(ns, stack, nodes[0])
        assert await until(lambda: _mirror_has(stack, 4))
        small = [f"w{i}" for i in range(4)]
        await e.submit(*(submit(j, Demand(kind="gpus", gpus=1), tenant="team") for j in small))
        assert await until(e.all_in(small, "running"))
        await e.submit(submit("urgent-gang", Demand(kind="gpus", gpus=3), tenant="urgent"))
        assert await until(e.all_in(["urgent-gang"], "running"))
        states = await e.states(small)
        assert sorted(states.values()) == ["pending", "pending", "pending", "running"]  # the fewest victims
        job = await ns.state.job("urgent-gang")
        assert job is not None and len({g.rpartition("/")[0] for g, _ in job.slots}) == 2
        await e.clean()
        for ex in nodes:
            await ex.stop()
        await stack.stop()
