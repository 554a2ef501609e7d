"""Whole-GPU gangs and time-sliced shares through the live services (balancer, registry, node registry) on
real NATS + Redis, with scripted executors whose GPUs are not in MIG mode: a 2-GPU gang placed on one node and
finished, shares up to ``replicas`` on one GPU with the next one waiting, a mixed cluster where MIG requests
never land on non-MIG GPUs and plain requests never on MIG GPUs, a gang on full-size MIG instances, and a
gang launched once per node, which never takes MIG GPUs (a process sees one MIG device)."""

from __future__ import annotations

import msgspec
import pytest
from plain_cluster import Env, env_of, submit, until

from migsched.clusterview import job_row
from shared.events import Demand, JobSubmit, Workload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

plain_node = env_of(2, {0: 0, 1: 0})
shared_node = env_of(1, {0: 3})
mixed_node = env_of(4, {2: 0, 3: 2})
mig_pair_node = env_of(3, {2: 0})
tenant_node = env_of(4, {0: 0, 1: 0, 2: 0, 3: 2}, tenancy=True)
half_mig_node = env_of(4, {2: 0, 3: 0})
half_mig_tenant_node = env_of(4, {2: 0, 3: 0}, tenancy=True)


def per_node(job: str, gpus: int) -> JobSubmit:
    """A gang whose workload starts once per node with all of that node's GPUs."""
    return msgspec.structs.replace(submit(job, Demand(kind="gpus", gpus=gpus)), workload=Workload(launch="per-node"))


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


async def test_a_per_node_gang_waits_for_gpus_out_of_mig_mode_rather_than_take_free_mig_ones(
    half_mig_node: Env,
) -> None:
    await _per_node_waits_for_plain_gpus(half_mig_node)


async def test_with_tenancy_a_per_node_gang_also_waits_for_gpus_out_of_mig_mode(half_mig_tenant_node: Env) -> None:
    await _per_node_waits_for_plain_gpus(half_mig_tenant_node)


async def _per_node_waits_for_plain_gpus(e: Env) -> None:
    """GPUs 0, 1 in MIG mode and empty; GPUs 2, 3 whole-only."""
    await e.submit(submit("one", Demand(kind="gpus", gpus=1)))
    assert await until(e.all_in(["one"], "running"))
    assert (await e.ns.state.job("one")).gpu in ("n1/2", "n1/3")  # type: ignore[union-attr]
    await e.submit(per_node("pn", 2))
    assert await until(e.all_in(["pn"], "pending"))
    assert not [c for c in e.ex.commands("place") if c.job_id == "pn"]  # the free MIG GPUs are not for it
    await e.ex.exit(["one"])
    assert await until(e.all_in(["pn"], "running"))
    (cmd,) = [c for c in e.ex.commands("place") if c.job_id == "pn"]
    assert sorted(s.gpu_index for s in cmd.plain) == [2, 3] and cmd.mig_members == ()
    assert cmd.gang is not None and cmd.gang.launch == "per-node"
    await e.ex.exit(["pn"])
    assert await until(e.all_in(["pn"], "finished"))
    await e.clean()


async def test_a_per_node_gang_bigger_than_the_gpus_out_of_mig_mode_is_rejected_with_the_reason(
    mig_pair_node: Env,
) -> None:
    e = mig_pair_node  # GPUs 0, 1 in MIG mode; GPU 2 whole-only
    await e.submit(per_node("pn", 2))
    assert await until(e.all_in(["pn"], "rejected"))
    hist = await e.ns.state.history("pn")
    assert hist[-1].reason == ("launch per-node needs 2 GPUs not in MIG mode (a process sees one MIG device); "
                               "the cluster has 1")
    await e.clean()


async def test_a_mig_request_or_a_share_the_cluster_has_no_gpu_for_is_rejected_with_the_reason(
    plain_node: Env,
) -> None:
    e = plain_node  # two whole GPUs, neither in MIG mode nor time-sliced
    await e.submit(submit("mig", Demand(kind="mig", profile="3g.20gb")), submit("share", Demand(kind="shared")))
    assert await until(e.all_in(["mig", "share"], "rejected"))
    assert (await e.ns.state.history("mig"))[-1].reason == "3g.20gb needs a GPU in MIG mode; none here is"
    assert (await e.ns.state.history("share"))[-1].reason.startswith("a time-sliced share needs a GPU not in MIG")
    # what status shows of a job rejected on arrival: what it asked
    assert [job_row(r).demand for r in await e.ns.state.jobs(["mig", "share"]) if r is not None] == ["3g.20gb",
                                                                                                    "shared"]
    await e.submit(submit("gang", Demand(kind="gpus", gpus=2)))  # what the GPUs can take still runs
    assert await until(e.all_in(["gang"], "running"))
    await e.clean()
