"""The node registry and its node registry against real NATS + Redis: commands, failures, liveness."""

from __future__ import annotations

import pytest

from services.balancer.candidate import Candidate
from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings, until
from shared.events import Demand, JobSubmit, now
from shared.mig.geometry import default_geometry
from shared.state import audit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(40)]
GEO = default_geometry()


def submit(job: str, profile: str) -> JobSubmit:
    return JobSubmit(
        id=f"s-{job}", job_id=job, demand=Demand(kind="mig", profile=profile), submitted_at=now()
    )




def is_(ns: Namespace, job: str, state: str):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        j = await ns.state.job(job)
        return j is not None and j.state == state

    return check


def ready(stack: Stack, n: int):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return len(stack.balancer.mirrors[0]) >= n

    return check


async def started(
    prefix: str, nats_url: str, redis_url: str, ns: Namespace, gpus: int = 1, instances=(), **kw
):  # type: ignore[no-untyped-def]
    stack = Stack(prefix, nats_url, redis_url, **kw)
    await stack.start()
    ex = ScriptedExecutor(ns.bus, "n1", gpus=gpus)
    await ex.start(instances)
    assert await until(ready(stack, gpus))
    return stack, ex


async def test_a_placement_becomes_destroy_then_create_then_start(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        # the node reports two idle 1g instances at slices 0 and 1: a 4g at 0 must destroy both first
        stack, ex = await started(
            prefix, nats_url, redis_url, ns, instances=[(0, "1g.5gb", 0), (0, "1g.5gb", 1), (0, "3g.20gb", 4)]
        )
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("j1", "4g.20gb"))
        assert await until(is_(ns, "j1", "running"))
        (cmd,) = ex.commands("place")
        assert [(o.kind, o.profile, o.start) for o in cmd.ops] == [
            ("destroy_ci", "1g.5gb", 0),
            ("destroy_gi", "1g.5gb", 0),
            ("destroy_ci", "1g.5gb", 1),
            ("destroy_gi", "1g.5gb", 1),
            ("create_gi", "4g.20gb", 0),
            ("create_ci", "4g.20gb", 0),
        ]
        assert cmd.node == "n1" and cmd.gpu_index == 0 and cmd.instance_id == "n1/0:4g.20gb@0:j1"
        assert cmd.job_id == "j1" and cmd.submitted_at > 0
        # the idle 3g is reused as it is: no operations at all
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("j2", "3g.20gb"))
        assert await until(is_(ns, "j2", "running"))
        assert (
            ex.commands("place")[1].ops == ()
            and ex.commands("place")[1].instance_id == "n1/0:3g.20gb@4:adopted3"
        )
        assert await ns.state.commands(0) == {}
        assert await audit(ns.state, GEO) == []
        await ex.stop()
        await stack.stop()


async def test_a_failed_command_releases_the_reservation_and_the_job_is_placed_again(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack, ex = await started(prefix, nats_url, redis_url, ns)
        ex.fail_once.add("j1")
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("j1", "2g.10gb"))
        assert await until(lambda: _gt(len(ex.commands("place")), 2))
        assert await until(is_(ns, "j1", "running"), timeout=30.0)
        hist = await ns.state.history("j1")
        assert [h.to for h in hist][:3] == ["placing", "pending", "placing"]
        assert "scripted failure" in hist[1].reason
        assert [c.cmd_id for c in ex.commands("place")][:2] == ["place:j1:0", "place:j1:1"]
        assert await audit(ns.state, GEO) == []
        await ex.stop()
        await stack.stop()


async def test_a_job_that_fails_everywhere_is_failed_after_max_attempts(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack, ex = await started(prefix, nats_url, redis_url, ns, max_attempts=2)
        ex.fail_jobs.add("j1")
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("j1", "1g.5gb"))
        assert await until(is_(ns, "j1", "failed"))
        assert len(ex.commands("place")) == 2
        assert await audit(ns.state, GEO) == []
        await ex.stop()
        await stack.stop()


async def _gt(a: int, b: int) -> bool:
    return a >= b


async def test_an_idle_instance_nobody_asks_for_is_destroyed_after_the_exit(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack, ex = await started(prefix, nats_url, redis_url, ns)
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("j1", "3g.20gb"))
        assert await until(is_(ns, "j1", "running"))
        stack.registry.idle.demand._counts.clear()  # as if the window had passed with no 3g demand
        stack.registry.idle.demand._events.clear()
        await ex.exit(["j1"])
        assert await until(lambda: _gt(len(ex.commands("destroy_idle")), 1))
        (cmd,) = ex.commands("destroy_idle")
        assert [o.kind for o in cmd.ops] == [
            "destroy_ci",
            "destroy_gi",
        ] and cmd.instance_id == "n1/0:3g.20gb@4:j1"

        async def gone() -> bool:
            (g,) = await ns.state.get_gpus(["n1/0"])
            return g is not None and g.instances == []

        assert await until(gone)
        assert (await ns.state.job("j1")).state == "finished"  # type: ignore[union-attr]
        await ex.stop()
        await stack.stop()


async def test_an_idle_instance_in_recent_demand_is_kept(prefix: str, nats_url: str, redis_url: str) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack, ex = await started(prefix, nats_url, redis_url, ns)
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("j1", "3g.20gb"))
        assert await until(is_(ns, "j1", "running"))
        await ex.exit(["j1"])
        assert await until(is_(ns, "j1", "finished"))

        async def balancer_saw_exit() -> bool:  # jobs.exit reaches it on its own stream, maybe after j2's submit
            return all(i.job_id is None for i in stack.balancer.mirrors[0].get("n1/0").instances)

        assert await until(balancer_saw_exit)
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("j2", "3g.20gb"))
        assert await until(is_(ns, "j2", "running"))
        assert ex.commands("destroy_idle") == []
        assert ex.commands("place")[1].ops == ()  # reused
        await ex.stop()
        await stack.stop()


async def test_a_silent_node_is_marked_lost_and_its_jobs_requeued(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack, ex = await started(prefix, nats_url, redis_url, ns, node_timeout_s=1.0)
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("j1", "1g.5gb"))
        assert await until(is_(ns, "j1", "running"))
        assert await until(is_(ns, "j1", "pending"), timeout=10)  # no heartbeats at all
        hist = await ns.state.history("j1")
        assert "missed heartbeats" in hist[-1].reason
        assert (await ns.state.nodes())["n1"]["state"] == "lost"
        (g,) = await ns.state.get_gpus(["n1/0"])
        assert g is not None and not g.healthy
        # the node speaks again: it is told to resync, re-registers, and the job runs again
        await ex.heartbeat()
        assert await until(lambda: _gt(len(ex.commands("resync")), 1))
        await ex.register()
        assert await until(is_(ns, "j1", "running"))
        assert await audit(ns.state, GEO) == []
        await ex.stop()
        await stack.stop()


@pytest.mark.parametrize(
    ("track", "why", "next_command"),
    [
        # a reservation whose command was never tracked (an older balancer, committed before it crashed)
        (False, "no command was sent", "place:orphan:1"),
        # the default path: the reservation tracked the place command the balancer was about to send
        (True, "no result for place:orphan:0", "place:orphan:1"),
    ],
    ids=["untracked", "tracked"],
)
async def test_a_reservation_whose_command_never_went_out_is_requeued_and_placed(
    prefix: str, nats_url: str, redis_url: str, track: bool, why: str, next_command: str
) -> None:
    import time

    from shared.events import encode
    from shared.state import Reservation, StoredInstance

    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack, ex = await started(prefix, nats_url, redis_url, ns, cmd_timeout_s=1.0)
        spec = submit("orphan", "1g.5gb")
        inst = StoredInstance(id="n1/0:1g.5gb@6:orphan", profile="1g.5gb", start=6, size=1, compute=1)
        (g,) = await ns.state.get_gpus(["n1/0"])
        r = Reservation(job_id="orphan", gpu_id="n1/0", expected_ver=g.ver, instance=inst, action="create",
                        max_count=7, spec=encode(spec), submitted_at=spec.submitted_at, track=track)
        assert (await ns.state.reserve(r, time.time() - 5)).ok
        assert list(await ns.state.commands(0)) == (["place:orphan:0"] if track else [])
        assert await until(is_(ns, "orphan", "running"), timeout=15)
        hist = await ns.state.history("orphan")
        assert why in hist[1].reason
        assert [c.cmd_id for c in ex.commands("place")] == [next_command]  # the next attempt's command
        assert await audit(ns.state, GEO) == []
        await ex.stop()
        await stack.stop()


async def test_a_placement_whose_plan_conflicts_is_never_sent_but_failed_and_its_tracked_command_forgotten(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    import time

    from shared.events import JobInfo, Placed, encode, wire_gpu
    from shared.policy.gpu_view import GpuView, InstanceView
    from shared.policy.placement.decision import Placement, Slot
    from shared.state import Reservation, StoredInstance

    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack, ex = await started(prefix, nats_url, redis_url, ns)
        spec = submit("clash", "1g.5gb")
        inst = StoredInstance(id="n1/0:1g.5gb@6:clash", profile="1g.5gb", start=6, size=1, compute=1)
        (g,) = await ns.state.get_gpus(["n1/0"])
        r = Reservation(job_id="clash", gpu_id="n1/0", expected_ver=g.ver, instance=inst, action="create",
                        max_count=7, spec=encode(spec), submitted_at=spec.submitted_at, track=True)
        assert (await ns.state.reserve(r, time.time())).ok
        # a view in which another job's instance holds the slot: the plan conflicts (a CAS rules this out; the
        # balancer must still never act on it)
        busy = InstanceView(id="n1/0:1g.5gb@6:other", profile="1g.5gb", start=6, size=1, compute=1, job_id="other")
        view = wire_gpu(GpuView.build(id="n1/0", node="n1", index=0, model="A100-40GB", instances=(busy,)))
        slot = Slot(gpu_id="n1/0", node="n1", model="A100-40GB", profile="1g.5gb", start=6, size=1, compute=1,
                    action="create")
        placed = Placed(id="p-clash", job_id="clash", gpu=view, gpu_version=g.ver, decided_at=time.time(),
                        job=JobInfo(submitted_at=spec.submitted_at),
                        placement=Placement(job_id="clash", policy="test", slots=(slot,), tier="lazy",
                                            frag_before=0.0, frag_after=0.0))
        # nothing is sent for it
        assert stack.balancer.dispatcher.commands(placed, _candidate(spec), time.time()) is None
        await stack.balancer.dispatcher.give_back([placed])
        ok = await until(is_(ns, "clash", "running"))  # re-queued, then placed again by the balancer
        assert ok, (await ns.state.job("clash"), await ns.state.history("clash"), await ns.state.commands(0))
        hist = await ns.state.history("clash")
        assert "partition plan conflict" in hist[1].reason
        assert [c.cmd_id for c in ex.commands("place")] == ["place:clash:1"]
        assert await ns.state.commands(0) == {}  # the conflicting attempt's tracked command is gone too
        assert await audit(ns.state, GEO) == []
        await ex.stop()
        await stack.stop()


def _candidate(spec: JobSubmit) -> Candidate:
    return Candidate(submit=spec, spec=b"{}", ctx=None)
