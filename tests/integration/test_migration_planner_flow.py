"""The migration planner against real NATS + Redis: an exit leaves a lazy GPU, the planner pulls a job from
the
busy one, and the node registry carries the move out make-before-break."""

from __future__ import annotations

import time

import pytest
from prometheus_client import REGISTRY

from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings, until
from shared.events import Demand, JobExited, JobSubmit, encode, new_id
from shared.mig.geometry import default_geometry
from shared.state import Reservation, StoredInstance, audit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(40)]
GEO = default_geometry()
A100 = GEO.model("A100-40GB")




async def run_job(
    ns: Namespace, job: str, gpu: str, profile: str, start: int, hint_s: float | None = None
) -> str:
    p = A100.profile(profile)
    spec = b""
    if hint_s is not None:
        spec = encode(
            JobSubmit(
                id=f"s-{job}",
                job_id=job,
                demand=Demand(kind="mig", profile=profile),
                duration_hint_s=hint_s,
                submitted_at=time.time(),
            )
        )
    (g,) = await ns.state.get_gpus([gpu])
    iid = f"{gpu}:{profile}@{start}:{job}"
    inst = StoredInstance(
        id=iid, profile=profile, start=start, size=p.memory_slices, compute=p.compute_slices
    )
    r = await ns.state.reserve(
        Reservation(
            job_id=job,
            gpu_id=gpu,
            expected_ver=g.ver,
            instance=inst,  # type: ignore[union-attr]
            action="create",
            max_count=p.max_count,
            spec=spec,
        ),
        time.time(),
    )
    assert r.ok
    assert await ns.state.mark_running(job, iid, time.time()) == "ok"
    return iid


async def test_an_exit_on_a_lazy_gpu_pulls_a_job_from_a_busy_one(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, planner=True)
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=2)
        await ex.start()

        async def registered() -> bool:
            return len(await ns.state.gpu_ids()) == 2

        assert await until(registered)
        await run_job(ns, "ja", "n1/0", "3g.20gb", 4)
        await run_job(ns, "jb", "n1/0", "1g.5gb", 0)
        await run_job(ns, "jc", "n1/0", "1g.5gb", 2)
        jd = await run_job(ns, "jd", "n1/1", "1g.5gb", 6)
        await ns.bus.publish(
            ns.bus.subjects.node_report("n1"),
            JobExited(
                id=new_id("x"),
                node="n1",
                at=time.time(),
                job_id="jd",
                gpu_index=1,
                instance_id=jd,
                exit="completed",
            ),
        )

        async def moved() -> bool:
            j = await ns.state.job("jb")
            return j is not None and j.state == "running" and j.gpu == "n1/1"

        assert await until(moved)
        (start,) = ex.commands("migrate_start")
        (stop,) = ex.commands("migrate_stop")
        assert start.job_id == "jb" and start.src_instance_id == "n1/0:1g.5gb@0:jb"
        assert [o.kind for o in start.ops][-2:] == ["create_gi", "create_ci"]
        assert (
            stop.node == "n1"
            and stop.src_instance_id == "n1/0:1g.5gb@0:jb"
            and stop.instance_id == start.instance_id
        )
        hist = [h.to for h in await ns.state.history("jb")]
        assert hist[-2:] == ["migrating", "running"]
        g0, g1 = await ns.state.get_gpus(["n1/0", "n1/1"])
        assert g1 is not None and any(i.job == "jb" and i.state == "busy" for i in g1.instances)
        assert g0 is not None and not any(i.job == "jb" for i in g0.instances)
        assert stack.planner.ordered == 1
        assert await audit(ns.state, GEO) == []
        await ex.stop()
        await stack.stop()


def skipped() -> float:
    return sum(
        REGISTRY.get_sample_value(
            "migsched_migrations_total", {"kind": kind, "outcome": "skipped_ends_soon"}
        )
        or 0.0
        for kind in ("intra", "inter")
    )


@pytest.mark.parametrize(("hint_s", "moves"), [(5.0, False), (3600.0, True)])
async def test_a_job_whose_hint_says_it_ends_soon_is_not_moved_and_one_with_long_left_is(
    prefix: str, nats_url: str, redis_url: str, hint_s: float, moves: bool
) -> None:
    # the planner's default min_left_s is 30 s: a job with 5 s left gives its room back by its exit as soon as
    # a move would; one with an hour left is worth moving
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, planner=True)
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=2)
        await ex.start()

        async def registered() -> bool:
            return len(await ns.state.gpu_ids()) == 2

        assert await until(registered)
        for job, profile, start in (("ja", "3g.20gb", 4), ("jb", "1g.5gb", 0), ("jc", "1g.5gb", 2)):
            await run_job(ns, job, "n1/0", profile, start, hint_s=hint_s)
        jd = await run_job(ns, "jd", "n1/1", "1g.5gb", 6)
        before = skipped()
        await ns.bus.publish(
            ns.bus.subjects.node_report("n1"),
            JobExited(
                id=new_id("x"), node="n1", at=time.time(), job_id="jd", gpu_index=1, instance_id=jd,
                exit="completed",
            ),
        )

        async def decided() -> bool:
            return stack.planner.ordered > 0 or skipped() > before

        assert await until(decided)
        if moves:
            assert stack.planner.ordered >= 1 and skipped() == before

            async def started() -> bool:  # the order goes through the node registry before reaching the node
                return bool(ex.commands("migrate_start"))

            assert await until(started)
        else:
            assert stack.planner.ordered == 0 and skipped() > before
            assert not ex.commands("migrate_start")
            assert all(j is not None and j.state == "running" and j.gpu == "n1/0"
                       for j in [await ns.state.job(x) for x in ("ja", "jb", "jc")])
        assert await audit(ns.state, GEO) == []
        await ex.stop()
        await stack.stop()


async def test_the_planner_reads_exits_as_unacknowledged_hints_and_removes_the_old_acknowledging_consumer(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    from nats.js import api
    from nats.js.errors import NotFoundError

    from services.migration_planner.service import EXIT_HINTS

    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stream = ns.bus.subjects.stream_jobs
        # what an older planner left: a durable that acknowledged each exit (never read again, it would pile up)
        await ns.bus.js.add_consumer(stream, api.ConsumerConfig(
            durable_name="planner-exit", filter_subject=ns.bus.subjects.jobs_exit,
            ack_policy=api.AckPolicy.EXPLICIT))
        stack = Stack(prefix, nats_url, redis_url, planner=True)
        await stack.start()
        try:
            info = await ns.bus.js.consumer_info(stream, EXIT_HINTS)
            assert info.config.ack_policy == "none"
            with pytest.raises(NotFoundError):
                await ns.bus.js.consumer_info(stream, "planner-exit")
            mirrors = [c for c in (await ns.bus.js.consumers_info(stream)) if c.name.startswith("balancer-exit-")]
            assert len(mirrors) == 1 and mirrors[0].config.ack_policy == "none"
        finally:
            await stack.stop()


async def test_a_server_that_refuses_to_delete_the_old_consumer_costs_a_warning_not_the_start(
    prefix: str, nats_url: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)):
        stack = Stack(prefix, nats_url, redis_url, planner=True)
        await stack.start()
        try:
            planner = stack.planner

            async def refused(*a: object, **kw: object) -> None:  # as a config without the grant answers
                raise TimeoutError("nats: timeout")

            planner.bus.nc.request = refused
            with caplog.at_level("WARNING"):
                await planner.prepare()
            assert "could not delete the retired consumer planner-exit" in caplog.text
        finally:
            await stack.stop()


async def test_after_exit_passes_that_find_nothing_to_move_back_off_and_one_that_orders_a_move_ends_it(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    import dataclasses

    from services.migration_planner.service import MigrationPlanner
    from shared.settings import MigrationPlannerSettings, load

    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url)  # the registry; the planner below is driven by hand
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=2)
        await ex.start()
        planner = await MigrationPlanner.create(load(
            MigrationPlannerSettings, namespace=prefix, nats_url=nats_url, redis_url=redis_url,
            stream_storage="memory", metrics_port=0, cooldown_s=0.0, defrag_interval_s=0.0, policy="paper"))
        try:
            async def registered() -> bool:
                return len(await ns.state.gpu_ids()) == 2

            assert await until(registered)
            # a pull into the lazy n1/1 is planned on every pass, but these jobs end too soon to be worth it
            for job, profile, start in (("ja", "3g.20gb", 4), ("jb", "1g.5gb", 0), ("jc", "1g.5gb", 2)):
                await run_job(ns, job, "n1/0", profile, start, hint_s=5.0)
            await run_job(ns, "jd", "n1/1", "1g.5gb", 6)
            reads = 0
            snapshot = planner.state.snapshot

            async def counted(*a: object, **kw: object) -> object:
                nonlocal reads
                reads += 1
                return await snapshot(*a, **kw)

            planner.state.snapshot = counted
            clock = [100.0]
            planner.clock = lambda: clock[0]
            seen: list[tuple[float, int, float]] = []
            for at in (100.0, 100.5, 101.0, 101.5, 102.0, 102.5, 103.0, 105.0, 107.0):
                clock[0] = at
                planner._exited.setdefault("n1/1", None)  # an exit there since the last pass
                assert await planner.plan_exits() == 0
                seen.append((at, reads, planner.plan_wait_s))
            # passes at 100, 101, 103 and 107 only: waits of 0.5 -> 1 -> 2 -> 4 s, then the 4 s cap
            assert seen == [(100.0, 1, 1.0), (100.5, 1, 1.0), (101.0, 2, 2.0), (101.5, 2, 2.0), (102.0, 2, 2.0),
                            (102.5, 2, 2.0), (103.0, 3, 4.0), (105.0, 3, 4.0), (107.0, 4, 4.0)]

            planner.settings = dataclasses.replace(planner.settings, min_left_s=0.0)  # now every move pays
            clock[0] = 109.0
            planner._exited.setdefault("n1/1", None)
            assert await planner.plan_exits() == 0  # still backing off: due at 110.75
            assert reads == 4 and "n1/1" in planner._exited  # a skipped tick keeps its exits for the next pass
            clock[0] = 111.0
            assert await planner.plan_exits() == 1
            assert reads == 5 and planner.plan_wait_s == 0.5

            async def moved() -> bool:
                return bool(ex.commands("migrate_stop"))

            assert await until(moved)
        finally:
            await planner.bus.close()
            await planner.state.close()
            await ex.stop()
            await stack.stop()
        assert await until(lambda: _clean(ns))


async def _clean(ns: Namespace) -> bool:
    return await audit(ns.state, GEO) == []
