"""The balancer against real NATS + Redis: place and publish, queue when full, backfill on exit, idempotency,
cancel, and two replicas that never double-book."""

from __future__ import annotations

import pytest

from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings, until
from shared.bus import Outgoing
from shared.events import Demand, JobCancel, JobSubmit, now
from shared.mig.geometry import default_geometry
from shared.state import audit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(40)]
GEO = default_geometry()


def submit(job: str, profile: str, priority: int = 0, msg: str | None = None) -> JobSubmit:
    return JobSubmit(
        id=msg or f"s-{job}",
        job_id=job,
        demand=Demand(kind="mig", profile=profile),
        priority=priority,
        submitted_at=now(),
    )




async def states(ns: Namespace, jobs: list[str]) -> dict[str, str]:
    return {j.job_id: j.state for j in await ns.state.jobs(jobs) if j is not None}


@pytest.fixture
async def env(prefix: str, nats_url: str, redis_url: str):  # type: ignore[no-untyped-def]
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url)
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=1)
        await ex.start()
        assert await until(lambda: _has_gpus(ns, 1))
        assert await until(lambda: _mirror_ready(stack, 1))
        yield ns, stack, ex
        await ex.stop()
        await stack.stop()


async def _has_gpus(ns: Namespace, n: int) -> bool:
    return len(await ns.state.gpu_ids()) >= n


async def _mirror_ready(stack: Stack, n: int) -> bool:
    return len(stack.balancer.mirrors[0]) >= n


async def test_a_submitted_job_is_placed_and_the_balancer_sends_its_command_itself(env) -> None:  # type: ignore[no-untyped-def]
    ns, _, ex = env
    await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("j1", "3g.20gb"))
    assert await until(lambda: _async(len(ex.commands("place")) == 1))
    cmd = ex.commands("place")[0]
    assert (cmd.cmd_id, cmd.node, cmd.gpu_id, cmd.job_id) == ("place:j1:0", "n1", "n1/0", "j1")
    created = [op for op in cmd.ops if op.kind == "create_gi"]
    assert [(op.profile, op.instance_id) for op in created] == [("3g.20gb", cmd.instance_id)]
    assert await until(lambda: _is(ns, "j1", "running"))
    job = await ns.state.job("j1")
    assert job is not None and (job.gpu, job.inst) == ("n1/0", cmd.instance_id)
    # nothing went through sched.placed: the node registry had no hop to make
    subj = ns.bus.subjects.sched_placed
    info = await ns.bus.js.stream_info(ns.bus.subjects.stream_sched, subjects_filter=subj)
    assert (info.state.subjects or {}).get(subj, 0) == 0


async def _async(v: bool) -> bool:
    return v


async def _is(ns: Namespace, job: str, state: str) -> bool:
    j = await ns.state.job(job)
    return j is not None and j.state == state


async def _gpu_full_and_one_waiting(ns: Namespace) -> None:
    """"big" runs on the only GPU (a whole 7g), "small" (1g) waits in the queue."""
    await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("big", "7g.40gb"))
    assert await until(lambda: _is(ns, "big", "running"))
    await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("small", "1g.5gb"))
    assert await until(lambda: _is(ns, "small", "pending"))


async def test_a_job_that_does_not_fit_waits_and_is_backfilled_after_an_exit(env) -> None:  # type: ignore[no-untyped-def]
    ns, _stack, ex = env
    await _gpu_full_and_one_waiting(ns)
    job = await ns.state.job("small")
    assert job is not None and "cannot place" in job.reason and "1g.5gb" in job.reason
    await ex.exit(["big"])
    assert await until(lambda: _is(ns, "small", "running"))
    assert [h.to for h in await ns.state.history("small")] == ["pending", "placing", "running"]
    assert await audit(ns.state, GEO) == []


async def test_an_exit_the_mirror_failed_to_apply_reloads_the_mirror_and_the_waiting_job_starts(env) -> None:  # type: ignore[no-untyped-def]
    ns, stack, ex = env
    await _gpu_full_and_one_waiting(ns)
    mirror = stack.balancer.mirrors[0]
    failures: list[str] = []

    def broken_release(*a: object) -> bool:  # once: the exit is unacknowledged, so it never comes back
        failures.append("release")
        del mirror.release
        raise RuntimeError("mirror fault")

    mirror.release = broken_release
    await ex.exit(["big"])
    # the periodic refresh (10 s) is later than this wait: only the reload the lost exit asks for places it
    assert await until(lambda: _is(ns, "small", "running"), timeout=5.0)
    assert failures == ["release"]


async def test_a_replayed_submit_changes_nothing(env) -> None:  # type: ignore[no-untyped-def]
    ns, _stack, ex = env
    await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("j1", "1g.5gb", msg="a"))
    assert await until(lambda: _is(ns, "j1", "running"))
    await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("j1", "1g.5gb", msg="b"))  # new msg id, same job
    await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("j2", "1g.5gb"))
    assert await until(lambda: _is(ns, "j2", "running"))
    assert [c.job_id for c in ex.commands("place")] == ["j1", "j2"]
    assert len(await ns.state.history("j1")) == 2


async def test_cancelling_a_pending_job_takes_it_out_of_the_queue(env) -> None:  # type: ignore[no-untyped-def]
    ns, _stack, ex = env
    await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("big", "7g.40gb"))
    assert await until(lambda: _is(ns, "big", "running"))
    await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("waits", "7g.40gb"))
    assert await until(lambda: _is(ns, "waits", "pending"))
    await ns.bus.publish(
        ns.bus.subjects.jobs_cancel, JobCancel(id="c1", job_id="waits", reason="user", at=now())
    )
    assert await until(lambda: _is(ns, "waits", "cancelled"))
    await ns.bus.publish(
        ns.bus.subjects.jobs_cancel, JobCancel(id="c2", job_id="big", reason="user", at=now())
    )
    assert await until(lambda: _is(ns, "big", "cancelled"))  # stop command -> exit cancelled -> release
    assert [c.job_id for c in ex.commands("stop")] == ["big"]
    # the request is recorded once, though the balancer and the node registry both read it
    asked = [h.reason for h in await ns.state.history("big") if h.reason.startswith("cancel requested")]
    assert asked == ["cancel requested: user"]
    assert await audit(ns.state, GEO) == []


async def test_two_balancer_replicas_never_double_book(prefix: str, nats_url: str, redis_url: str) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        a, b = Stack(prefix, nats_url, redis_url, batch=8), Stack(prefix, nats_url, redis_url, batch=8)
        await a.start()
        await b.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=2)
        await ex.start()
        assert await until(lambda: _mirror_ready(a, 2)) and await until(lambda: _mirror_ready(b, 2))
        jobs = [f"j{i}" for i in range(60)]
        await ns.bus.publish_batch([Outgoing(ns.bus.subjects.jobs_submit, submit(j, "1g.5gb")) for j in jobs])

        async def settled() -> bool:
            st = await states(ns, jobs)
            return len(st) == 60 and "placing" not in st.values()

        assert await until(settled, 15)
        st = await states(ns, jobs)
        assert sum(1 for s in st.values() if s == "running") == 14  # 2 GPUs x 7 x 1g.5gb
        assert sum(1 for s in st.values() if s == "pending") == 46
        assert await audit(ns.state, GEO) == []
        assert a.balancer.placed > 0 or b.balancer.placed > 0
        await ex.stop()
        await b.stop()
        await a.stop()


async def test_a_job_waiting_past_its_patience_is_rejected(env) -> None:  # type: ignore[no-untyped-def]
    ns, _stack, _ex = env
    await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("big", "7g.40gb"))
    assert await until(lambda: _is(ns, "big", "running"))
    impatient = JobSubmit(
        id="s-imp",
        job_id="imp",
        demand=Demand(kind="mig", profile="7g.40gb"),
        patience_s=0.5,
        submitted_at=now(),
    )
    await ns.bus.publish(ns.bus.subjects.jobs_submit, impatient)
    assert await until(lambda: _is(ns, "imp", "rejected"), timeout=10)
    hist = await ns.state.history("imp")
    assert [h.to for h in hist] == ["pending", "rejected"] and "patience" in hist[-1].reason


async def test_a_gang_bigger_than_the_cluster_is_rejected_with_its_reason(env) -> None:  # type: ignore[no-untyped-def]
    ns, _stack, _ex = env
    two = JobSubmit(id="s-two", job_id="two", demand=Demand(kind="gpus", gpus=2), submitted_at=now())
    await ns.bus.publish(ns.bus.subjects.jobs_submit, two)
    assert await until(lambda: _is(ns, "two", "rejected"))
    assert "needs 2 GPUs; the cluster has 1" in (await ns.state.job("two")).reason  # type: ignore[union-attr]


async def test_the_command_the_balancer_sends_is_tracked_until_the_executor_confirms_it(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url)
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=1, auto_ack=False)
        await ex.start()
        try:
            assert await until(lambda: _has_gpus(ns, 1))
            assert await until(lambda: _mirror_ready(stack, 1))
            await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("j1", "1g.5gb"))
            assert await until(lambda: _async(len(ex.commands("place")) == 1))
            cmd = ex.commands("place")[0]
            tracked = await ns.state.commands(0)
            assert list(tracked) == [cmd.cmd_id]  # recorded by the reservation itself, before the send
            assert {k: tracked[cmd.cmd_id][k] for k in ("node", "kind", "job", "gpu")} == {
                "node": "n1", "kind": "place", "job": "j1", "gpu": "n1/0"}
            assert tracked[cmd.cmd_id]["at"] == pytest.approx(cmd.at, abs=1e-3)
            assert await _is(ns, "j1", "placing")
            await ns.bus.publish_batch(ex.reply(cmd))  # the node confirms: running, no longer tracked
            assert await until(lambda: _is(ns, "j1", "running"))
            assert await ns.state.commands(0) == {}
        finally:
            await ex.stop()
            await stack.stop()
