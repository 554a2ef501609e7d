"""The balancer holds GPUs for a waiting whole-GPU job (real NATS + Redis): a backfill pass plans the hold, a
job whose hint outlasts it is kept off the held GPU, one that ends first may use it, and the holds are in
Redis for ``migsched status``; with a tenancy file too, where jobs go by the policy named; and for a gang on
GPUs not in MIG mode."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from migsched import clusterview
from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings
from shared.events import Demand, JobSubmit, now
from shared.mig.geometry import default_geometry
from tests.integration.plain_cluster import scripted_cluster
from tests.integration.test_balancer_flow import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
GEO = default_geometry()


def submit(job: str, profile: str, hint: float | None, tenant: str = "default") -> JobSubmit:
    return JobSubmit(id=f"s-{job}", job_id=job, demand=Demand(kind="mig", profile=profile),
                     duration_hint_s=hint, submitted_at=now(), tenant=tenant)


@contextlib.asynccontextmanager
async def one_node(prefix: str, nats_url: str, redis_url: str, gpus: int, slack_s: float = 0.0,
                   tenancy_file: str = "", default_hint_s: float = 0.0,
                   policy: str = "migsched") -> AsyncIterator[tuple[Namespace, Stack]]:
    """The stack with one scripted node of ``gpus`` GPUs, once the balancer's mirror holds them all. Holds are
    due at once (``MIGSCHED_RESERVE_AFTER_S=0``): these tests are about what a hold does."""
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, reserve_after_s=0.0, reserve_slack_s=slack_s,
                      tenancy_file=tenancy_file, default_hint_s=default_hint_s, policy=policy)
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=gpus)
        await ex.start()
        try:
            async def ready() -> bool:
                return len(stack.balancer.mirrors[0]) == gpus

            assert await until(ready)
            yield ns, stack
        finally:
            await ex.stop()
            await stack.stop()


def team_tenancy(folder: Path) -> str:
    """A tenancy file with one tenant, ``team``, and one priority class."""
    path = folder / "tenancy.toml"
    path.write_text('[priority_classes.normal]\nvalue = 100\ndefault = true\n\n[tenants.team]\n')
    return str(path)


def running_gpu(ns: Namespace) -> Callable[[str], Awaitable[str | None]]:
    """The GPU a job runs on, None while it does not run."""
    async def gpu_of(job: str) -> str | None:
        j = await ns.state.job(job)
        return j.gpu if j is not None and j.state == "running" else None
    return gpu_of


async def plan_holds_for(ns: Namespace, stack: Stack, job: str) -> None:
    """Wait until ``job`` waits in the queue, then run the backfill pass that plans the holds."""
    async def pending() -> bool:
        j = await ns.state.job(job)
        return j is not None and j.state == "pending"

    assert await until(pending)
    await stack.balancer.backfill()


async def hold_one_gpu(ns: Namespace, stack: Stack, tenant: str = "default") -> tuple[str, str]:
    """On two GPUs: a 4g on each (a 4g can only start at slice 0), the second ending far sooner, then a waiting
    7g and the backfill pass that holds for it the GPU that frees first. Returns (that GPU, the other)."""
    gpu_of = running_gpu(ns)
    await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("a", "4g.20gb", 10000.0, tenant))
    assert await until(lambda: gpu_of("a"))
    await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("b", "4g.20gb", 60.0, tenant))
    assert await until(lambda: gpu_of("b"))
    soon, late = await gpu_of("b"), await gpu_of("a")
    assert soon is not None and late is not None and soon != late
    await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("big", "7g.40gb", 100.0, tenant))
    await plan_holds_for(ns, stack, "big")
    at, holds = await ns.state.holds(0)
    assert [(h.job_id, h.gpus) for h in holds] == [("big", (soon,))] and at > 0
    return soon, late


async def test_a_waiting_whole_gpu_job_holds_the_gpu_that_frees_first(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with one_node(prefix, nats_url, redis_url, 2) as (ns, stack):
        gpu_of = running_gpu(ns)
        soon, late = await hold_one_gpu(ns, stack)

        # a 3g that would run long fits beside either 4g: the held GPU is kept for the waiting job
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("long", "3g.20gb", 50000.0))
        assert await until(lambda: gpu_of("long"))
        assert await gpu_of("long") == late
        # one that ends before the hold's start may use the held GPU (the other is full now)
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("short", "3g.20gb", 5.0))
        assert await until(lambda: gpu_of("short"))
        assert await gpu_of("short") == soon

        view = await clusterview.read(ns.state, GEO)
        assert [h.job_id for h in view.holds] == ["big"]
        assert view.reasons["big"].startswith("reserved: big: 1 GPU(s) on n1 held, expected free in")


@pytest.mark.parametrize("default_hint_s", [0.0, 600.0])
async def test_jobs_without_hints_let_a_hold_be_planned_only_with_a_default_expected_run(
    prefix: str, nats_url: str, redis_url: str, default_hint_s: float
) -> None:
    async with one_node(prefix, nats_url, redis_url, 2, default_hint_s=default_hint_s) as (ns, stack):
        gpu_of = running_gpu(ns)
        t0 = now()
        for job in ("a", "b"):  # a 4g on each GPU, neither with a hint
            await ns.bus.publish(ns.bus.subjects.jobs_submit, submit(job, "4g.20gb", None))
            assert await until(lambda job=job: gpu_of(job))  # type: ignore[misc]
        gpus = [g for g in (await ns.state.get_gpus([await gpu_of("a") or "", await gpu_of("b") or ""])) if g]
        ends = [i.ends for g in gpus for i in g.instances if i.job in ("a", "b")]
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("big", "7g.40gb", 100.0))
        await plan_holds_for(ns, stack, "big")
        _, holds = await ns.state.holds(0)
        if default_hint_s:
            # each run is expected to end 600 s after its placement: the hold counts on one of their GPUs
            assert len(ends) == 2 and all(t0 + 600.0 <= e <= now() + 600.0 for e in ends)
            assert [h.job_id for h in holds] == ["big"] and set(holds[0].gpus) <= {g.id for g in gpus}
        else:  # no end is known: no hold can be planned
            assert ends == [0.0, 0.0] and holds == []


async def test_with_tenancy_a_waiting_whole_gpu_job_gets_a_hold_that_long_jobs_keep_off(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    async with one_node(prefix, nats_url, redis_url, 2, tenancy_file=team_tenancy(tmp_path)) as (ns, stack):
        gpu_of = running_gpu(ns)
        soon, late = await hold_one_gpu(ns, stack, "team")
        view = await clusterview.read(ns.state, GEO)
        assert view.reasons["big"].startswith("reserved: big: 1 GPU(s) on n1 held, expected free in")
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("filler", "3g.20gb", 50000.0, "team"))
        assert await until(lambda: gpu_of("filler"))
        assert await gpu_of("filler") == late  # the other GPU is full now
        # only the held GPU has room for a 3g: a long one is kept off it, a short one may use it
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("long", "3g.20gb", 50000.0, "team"))
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("short", "3g.20gb", 5.0, "team"))
        assert await until(lambda: gpu_of("short"))
        assert await gpu_of("short") == soon
        long = await ns.state.job("long")
        assert long is not None and long.state == "pending"
        # its reason names the hold that keeps the free slices from it, not only "no room"
        assert "1 GPU(s) held for big (expected start in" in long.reason
        assert "are closed to it: its hint (50000 s) ends after that" in long.reason


async def test_with_tenancy_jobs_are_placed_by_the_policy_named(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    async with one_node(prefix, nats_url, redis_url, 2, tenancy_file=team_tenancy(tmp_path)) as (ns, _):
        gpu_of = running_gpu(ns)

        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("a", "3g.20gb", 1000.0, "team"))
        assert await until(lambda: gpu_of("a"))
        # migsched, the default, packs the 2g beside the 3g; the seeds' rule would open the empty GPU
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("b", "2g.10gb", 500.0, "team"))
        assert await until(lambda: gpu_of("b"))
        assert await gpu_of("b") == await gpu_of("a")


async def test_with_slack_a_job_ending_soon_after_the_hold_starts_may_use_the_held_gpu(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with one_node(prefix, nats_url, redis_url, 2, slack_s=3000.0) as (ns, stack):
        gpu_of = running_gpu(ns)
        soon, late = await hold_one_gpu(ns, stack)
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("long", "3g.20gb", 50000.0))
        assert await until(lambda: gpu_of("long"))
        assert await gpu_of("long") == late  # far past the hold's start and its slack: kept off the held GPU
        # ends ~1,000 s after the hold's start, within the 3,000-s slack: strict holds would keep it waiting
        # (the other GPU is full now)
        await ns.bus.publish(ns.bus.subjects.jobs_submit, submit("medium", "3g.20gb", 1000.0))
        assert await until(lambda: gpu_of("medium"))
        assert await gpu_of("medium") == soon


async def test_a_long_gang_kept_waiting_for_headroom_gets_no_hold_and_says_why(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with one_node(prefix, nats_url, redis_url, 4) as (ns, stack):
        def in_state(job: str, want: str) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                j = await ns.state.job(job)
                return j is not None and j.state == want
            return check

        for job in ("a", "b"):  # a 4g each, on a GPU of its own: two of the four GPUs stay empty
            await ns.bus.publish(ns.bus.subjects.jobs_submit, submit(job, "4g.20gb", 10000.0))
            assert await until(in_state(job, "running"))
        # 2 GPUs for 100 h is more than 4 h of the 4 GPUs: it would leave none of the two it must empty
        gang = JobSubmit(id="s-gang", job_id="gang", demand=Demand(kind="gpus", gpus=2),
                         duration_hint_s=360000.0, submitted_at=now())
        await ns.bus.publish(ns.bus.subjects.jobs_submit, gang)
        assert await until(in_state("gang", "pending"))
        await stack.balancer.backfill()
        _, holds = await ns.state.holds(0)
        assert holds == []
        view = await clusterview.read(ns.state, GEO)
        assert "a long gang (2 GPUs for 100.0 h" in view.reasons["gang"]


@pytest.mark.parametrize("tenancy", [False, True], ids=["plain", "with-tenancy"])
async def test_a_gang_waiting_on_gpus_not_in_mig_mode_holds_them_and_long_jobs_keep_off(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path, tenancy: bool
) -> None:
    whole2 = {"gpus": 2, "plain": {0: 0, 1: 0}}  # two whole (non-MIG) GPUs a node
    extra = {"tenancy_file": team_tenancy(tmp_path)} if tenancy else {}
    async with scripted_cluster(prefix, nats_url, redis_url, {"n1": whole2, "n2": whole2}, **extra) as e:
        def job(name: str, gpus: int, hint: float) -> JobSubmit:
            return JobSubmit(id=f"s-{name}", job_id=name, demand=Demand(kind="gpus", gpus=gpus),
                             duration_hint_s=hint, submitted_at=now(), tenant="team" if tenancy else "default")

        await e.submit(job("a", 1, 60.0), job("b", 1, 600.0))
        assert await until(e.all_in(["a", "b"], "running"))
        await e.submit(job("big", 4, 100.0))  # every GPU of both nodes: it waits for a and b
        assert await until(e.all_in(["big"], "pending"))
        await e.stack.balancer.backfill()
        _, holds = await e.ns.state.holds(0)
        assert [(h.job_id, len(h.gpus), h.nodes) for h in holds] == [("big", 4, ("n1", "n2"))]
        # the two free GPUs are held: a job that would outlast the hold's start waits, one that ends first runs
        await e.submit(job("long", 1, 50000.0))
        await e.submit(job("short", 1, 5.0))
        assert await until(e.all_in(["short"], "running"))
        assert await e.states(["long"]) == {"long": "pending"}
        view = await clusterview.read(e.ns.state, GEO)
        assert view.reasons["big"].startswith("reserved: big: 4 GPU(s) on n1, n2 held, expected free in")
        await e.clean()
