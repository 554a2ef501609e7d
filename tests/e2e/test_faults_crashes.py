"""Crash safety of the stack as processes, under a load of a few hundred short jobs, on private servers
(NATS with JetStream file storage, Redis with AOF) in a namespace of its own.

Each test kills something in the middle of the load and brings it back: one service with ``kill -9``
(balancer, registry, migration-planner, an executor), an executor for good (its heartbeats stop: the
node is lost and its jobs re-queued elsewhere), the NATS server, the Redis server. After each the cluster must
converge and every job be accounted for exactly once: one terminal state, exactly one completed exit per
finished job, no slice double-booked (``audit()`` clean) and nothing left holding slices.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from fault_harness import (
    FAULT_ENV,
    Load,
    Servers,
    assert_accounted,
    converge,
    jobs_for,
    kill9,
    make_stack,
    restart,
    settings_of,
    wait_for,
)

from migsched.stack import Stack
from shared.bus import JetStreamBus
from shared.state import RedisState

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

JOBS = 240
RATE = 60.0


@pytest.fixture(scope="module")
def stack(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    import uuid

    st = make_stack(servers, "f" + uuid.uuid4().hex[:8], tmp_path_factory.mktemp("fault-run"))
    try:
        asyncio.run(st.wait_ready(60))
        yield st
    finally:
        st.stop(servers=False)


async def _run(stack: Stack, tag: str, fault, after: float = 0.3, all_finished: bool = True):  # type: ignore[no-untyped-def]
    """Offer JOBS jobs at RATE/s; when ``after`` of them are published, ``await fault()``; converge."""
    bus = await JetStreamBus.connect(settings_of(stack), name=f"fault-load-{tag}")
    jobs = jobs_for(tag, JOBS)
    load = Load(bus, jobs, RATE)
    try:
        task = asyncio.create_task(load.run())
        await load.until_published(after)
        await fault()
        await asyncio.wait_for(task, 60)
    finally:
        await bus.close()
    out = await converge(stack, [j.job_id for j in jobs], timeout=60)
    assert_accounted(out, [j.job_id for j in jobs], all_finished=all_finished)
    return out


@pytest.mark.parametrize("service", ["balancer", "registry", "migration-planner", "executor-gpu-node-0"])
async def test_a_service_killed_with_sigkill_mid_load_and_restarted_loses_no_job(
    stack: Stack, service: str
) -> None:
    async def fault() -> None:
        kill9(stack, service)
        await asyncio.sleep(1.0)
        restart(stack, service)

    await _run(stack, f"k{service[:4]}", fault)


async def test_an_executor_that_dies_has_its_jobs_requeued_and_finished_elsewhere(stack: Stack) -> None:
    state = RedisState.from_settings(settings_of(stack))

    async def node_state() -> str:
        return (await state.nodes()).get("gpu-node-1", {}).get("state", "")

    async def fault() -> None:
        await asyncio.sleep(1.0)  # some of its jobs are running now
        kill9(stack, "executor-gpu-node-1")
        await wait_for(lambda: _is(node_state(), "lost"), 30, "gpu-node-1 to be marked lost")
        # the node is lost and its jobs are back in the queue: they run on gpu-node-0 meanwhile; then the
        # node comes back (a fresh executor registers again) for the rest of the load
        await asyncio.sleep(1.0)
        restart(stack, "executor-gpu-node-1")
        await wait_for(lambda: _is(node_state(), "up"), 30, "gpu-node-1 to register again")

    try:
        await _run(stack, "dead", fault, after=0.4)
        requeued = 0
        for n in range(JOBS):
            if any("missed heartbeats" in h.reason for h in await state.history(f"dead-{n}")):
                requeued += 1
        assert requeued > 0, "no job of the lost node was re-queued"
    finally:
        await state.close()


async def test_a_nats_restart_under_load_loses_no_job(stack: Stack, servers: Servers) -> None:
    async def fault() -> None:
        # Down for longer than the node timeout, so that silence alone would make every node lost. (Command
        # time-outs no longer count an outage either: tests/integration/test_registry_command_timeouts.py.)
        nats = servers.nats
        assert nats.proc is not None
        nats.proc.terminate()
        await asyncio.to_thread(nats.proc.wait, 10)
        await asyncio.sleep(float(FAULT_ENV["MIGSCHED_NODE_TIMEOUT_S"]) + 0.5)
        await asyncio.to_thread(nats.restart)

    # Every heartbeat stops while NATS restarts; the registry does not count that silence against the nodes
    # (services/registry/liveness.py), so no node is lost, no running job is re-queued, and all finish.
    await _run(stack, "nats", fault)
    state = RedisState.from_settings(settings_of(stack))
    try:
        requeued = [
            f"nats-{n}"
            for n in range(JOBS)
            if any("missed heartbeats" in h.reason for h in await state.history(f"nats-{n}"))
        ]
        assert requeued == [], f"jobs re-queued by a false node loss: {requeued[:10]}"
    finally:
        await state.close()


async def test_a_redis_restart_under_load_loses_no_job(stack: Stack, servers: Servers) -> None:
    async def fault() -> None:
        await asyncio.to_thread(servers.redis.restart)

    await _run(stack, "redis", fault)


async def _is(v, want: str) -> bool:  # type: ignore[no-untyped-def]
    return (await v) == want
