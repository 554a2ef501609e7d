"""Messages a durable consumer went past without delivering them, found after the consumer's leader changed on a
3-node NATS cluster: a submit is placed, a cancel applied."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY

from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings, until
from shared.bus import BusError, Delivery
from shared.events import Demand, JobCancel, JobSubmit, now
from shared.localcluster import NatsCluster

pytestmark = [pytest.mark.integration, pytest.mark.ha, pytest.mark.timeout(90)]
ACK_WAIT_S = 3.0  # the look back comes twice this after the change
ON_CLUSTER = {"stream_replicas": 3, "ack_wait_s": ACK_WAIT_S}


def submit(job: str) -> JobSubmit:
    return JobSubmit(id=f"s-{job}", job_id=job, demand=Demand(kind="mig", profile="1g.5gb"), submitted_at=now())


def missed_total() -> float:
    return REGISTRY.get_sample_value("migsched_balancer_missed_submits_total") or 0.0


async def go_past(ns: Namespace, durable: str, subject: str, msg: JobSubmit | JobCancel) -> None:
    """What a skipping server does: the durable goes past ``msg``, and the service never sees it."""
    taken: list[str] = []

    async def take(ds: list[Delivery]) -> None:
        taken.extend(d.data.job_id for d in ds)

    thief = ns.bus.consumer(ns.bus.subjects.stream_jobs, durable, subject, take)
    await thief.start()
    await ns.bus.publish(subject, msg)
    while not taken:
        await thief.poll(1.0)
    thief.stop()


async def step_down(ns: Namespace, durable: str) -> None:
    """The consumer's leader steps down: another server leads it."""
    reply = await ns.bus.nc.request(
        f"$JS.API.CONSUMER.LEADER.STEPDOWN.{ns.bus.subjects.stream_jobs}.{durable}", b"", timeout=5)
    assert b'"success":true' in reply.data.replace(b" ", b"")


@contextlib.asynccontextmanager
async def stack_on(ns: Namespace, prefix: str, nats_url: str, redis_url: str) -> AsyncIterator[
        tuple[Stack, ScriptedExecutor]]:
    """The balancer and the registry on the cluster, and a node of one GPU, ready."""
    stack = Stack(prefix, nats_url, redis_url, **ON_CLUSTER)
    await stack.start()
    ex = ScriptedExecutor(ns.bus, "n1", gpus=1)
    await ex.start()
    try:
        assert await until(lambda: _ready(stack), 20)
        yield stack, ex
    finally:
        await ex.stop()
        await stack.stop()


async def test_a_submit_skipped_across_a_change_of_the_consumers_leader_is_placed(
    nats_cluster: NatsCluster, prefix: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_cluster.url, redis_url, **ON_CLUSTER)) as ns:
        s = ns.bus.subjects
        await go_past(ns, "balancer-submit", s.jobs_submit, submit("skipped"))

        async with stack_on(ns, prefix, nats_cluster.url, redis_url) as (stack, ex):
            before = missed_total()
            assert await stack.balancer.decide_missed_submits() == 0  # the first look notes the leader
            await ns.bus.publish(s.jobs_submit, submit("ordinary"))
            assert await until(lambda: _placed(ex, "ordinary"), 20)
            assert await ns.state.job("skipped") is None

            await step_down(ns, "balancer-submit")
            assert await until(lambda: _placed(ex, "skipped"), 40)
            assert missed_total() - before == 1  # the ordinary submit, known to the state, was left alone
            assert [c.job_id for c in ex.commands("place")].count("ordinary") == 1


async def _ready(stack: Stack) -> bool:
    return len(stack.balancer.mirrors[0]) >= 1


async def _placed(ex: ScriptedExecutor, job: str) -> bool:
    return any(c.job_id == job for c in ex.commands("place"))


async def test_a_cancel_skipped_across_a_change_of_the_consumers_leader_is_applied(
    nats_cluster: NatsCluster, prefix: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_cluster.url, redis_url, **ON_CLUSTER)) as ns:
        s = ns.bus.subjects
        # a cancel sent ahead of its job's submit
        await go_past(ns, "partitioner-cancel", s.jobs_cancel,
                      JobCancel(id="c-late", job_id="late", reason="user", at=now()))

        async with stack_on(ns, prefix, nats_cluster.url, redis_url) as (stack, ex):
            assert await stack.registry.cancels.apply_skipped() == 0  # the first look notes the leader
            await step_down(ns, "partitioner-cancel")
            assert await until(lambda: _cancelled(ns, "late"), 40)
            await ns.bus.publish(s.jobs_submit, submit("late"))
            await ns.bus.publish(s.jobs_submit, submit("after"))
            assert await until(lambda: _placed(ex, "after"), 20)
            assert not await _placed(ex, "late")  # its submit found the cancel's tombstone


async def _cancelled(ns: Namespace, job: str) -> bool:
    rec = await ns.state.job(job)
    return rec is not None and rec.state == "cancelled"


async def test_a_consumer_leader_that_moves_away_and_back_reads_as_a_new_term(
    nats_cluster: NatsCluster, prefix: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_cluster.url, redis_url, **ON_CLUSTER)) as ns:
        s = ns.bus.subjects
        await go_past(ns, "led", s.jobs_submit, submit("any"))
        first = await ns.bus.consumer_lead(s.stream_jobs, "led")
        assert first is not None and first.leader
        name = _server(first.leader)
        seen = [first.leader]
        for _ in range(12):  # each step-down hands it to another server, until its first leader has it again
            await step_down(ns, "led")

            async def next_term() -> bool:
                try:
                    lead = await ns.bus.consumer_lead(s.stream_jobs, "led")
                except BusError:  # no leader to answer while it elects one
                    return False
                if lead is None or not lead.leader or lead.leader == seen[-1]:
                    return False
                seen.append(lead.leader)
                return True

            assert await until(next_term, 20)
            if _server(seen[-1]) == name:
                break
        assert _server(seen[-1]) == name, seen
        assert len(set(seen)) == len(seen), seen  # the same server, and a term a look can tell from its first


def _server(leader: str) -> str:
    """The server's name in a ``ConsumerLead.leader`` (before its ``@since`` or ``#elections``)."""
    return leader.split("@")[0].split("#")[0]
