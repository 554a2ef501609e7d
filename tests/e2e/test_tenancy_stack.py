"""Tenancy through the live stack (balancer + registry on real NATS and Redis, a scripted executor):
preemption by priority, quota holds, cohort borrowing and reclaim."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from migsched import clusterview
from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings, until
from shared.bus import Outgoing
from shared.events import Demand, JobSubmit, Preempted, now
from shared.state import audit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

TENANCY = """
[priority_classes.inference-low]
value = 100
preemption = "PreemptLowerPriority"

[priority_classes.training-high]
value = 900
preemption = "PreemptLowerPriority"

[priority_classes.pinned]
value = 50
preemptible = false

[cohorts.research]
reclaim = "Any"

[tenants.serve]
priority_class = "inference-low"

[tenants.train]
priority_class = "training-high"

[tenants.small]
quota = { compute_slices = 2 }

[tenants.lender]
cohort = "research"
quota = { compute_slices = 4 }

[tenants.borrower]
cohort = "research"
quota = { compute_slices = 3 }
"""


def submit(
    job: str, profile: str, tenant: str, klass: str | None = None, at: float | None = None
) -> JobSubmit:
    return JobSubmit(
        id=f"s-{job}",
        job_id=job,
        tenant=tenant,
        priority_class=klass,
        demand=Demand(kind="mig", profile=profile),
        submitted_at=now() if at is None else at,
    )




class Env:
    def __init__(self, ns: Namespace, stack: Stack, ex: ScriptedExecutor) -> None:
        self.ns, self.stack, self.ex = ns, stack, ex

    async def submit(self, *subs: JobSubmit) -> None:
        for s in subs:
            await self.ns.bus.publish(self.ns.bus.subjects.jobs_submit, s)

    async def states(self, jobs: list[str]) -> dict[str, str]:
        return {j.job_id: j.state for j in await self.ns.state.jobs(jobs) if j is not None}

    async def all_in(self, jobs: list[str], state: str) -> bool:
        st = await self.states(jobs)
        return all(st.get(j) == state for j in jobs)

    async def reason(self, job: str) -> str:
        rec = await self.ns.state.job(job)
        return rec.reason if rec else ""


@pytest.fixture
async def env(prefix: str, nats_url: str, redis_url: str, tmp_path: Path) -> AsyncIterator[Env]:
    path = tmp_path / "tenancy.toml"
    path.write_text(TENANCY)
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, tenancy_file=str(path), tenancy_poll_s=0.2)
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=1)
        await ex.start()
        assert await until(lambda: _ready(stack))
        yield Env(ns, stack, ex)
        await ex.stop()
        await stack.stop()


async def _ready(stack: Stack) -> bool:
    return len(stack.balancer.mirrors[0]) >= 1


async def _audit(e: Env) -> list[Any]:
    return list(await audit(e.ns.state, e.stack.balancer.geometry))


async def test_a_high_priority_training_job_preempts_low_priority_inference_on_a_full_cluster(
    env: Env,
) -> None:
    e = env
    t0 = now() - 100.0
    serve = [f"inf{n}" for n in range(7)]
    await e.submit(*(submit(j, "1g.5gb", "serve", at=t0 + n) for n, j in enumerate(serve)))
    assert await until(lambda: e.all_in(serve, "running"))

    announced = await e.ns.watch(e.ns.bus.subjects.sched_preempted, Preempted)
    await e.submit(submit("train1", "3g.20gb", "train"))
    assert await until(lambda: e.all_in(["train1"], "running"))

    st = await e.states(serve)
    victims = [j for j in serve if st[j] == "pending"]
    assert 1 <= len(victims) <= 4  # a 3g.20gb needs 4 memory slices: at most 4 of the 1g jobs go
    for v in victims:
        # recorded in its history (its current reason then says why it still waits: capacity)
        hist = await e.ns.state.history(v)
        assert hist[-1].to == "pending" and hist[-1].prev == "running"
        assert hist[-1].reason.startswith("preempted by train1")
        rec = await e.ns.state.job(v)
        assert rec is not None and rec.at == pytest.approx(t0 + serve.index(v))  # keeps its submit time
    # the node was told to stop the victims before the training job's instance is made
    place = [c for c in e.ex.commands("place") if c.job_id == "train1"]
    assert place and set(place[0].stop_jobs) == set(victims)
    # and every preemption is announced on sched.preempted, once, for observers
    assert await until(lambda: len(announced.seen) >= len(victims))
    await announced.close()
    assert sorted(p.job_id for p in announced.seen) == sorted(victims)
    for p in announced.seen:
        assert (p.by, p.tenant, p.priority) == ("train1", "serve", 100)
        assert p.reason and p.gpu_ids == ("n1/0",)
    assert not set(victims) & set(e.ex.running)
    assert await _audit(e) == []

    # the preempted jobs are re-queued and run later, when the training job ends
    await e.ex.exit(["train1"])
    assert await until(lambda: e.all_in(serve, "running"))
    assert await _audit(e) == []


async def test_a_non_preemptible_job_is_never_a_victim(env: Env) -> None:
    e = env
    pinned = [f"p{n}" for n in range(7)]
    await e.submit(*(submit(j, "1g.5gb", "serve", klass="pinned") for j in pinned))
    assert await until(lambda: e.all_in(pinned, "running"))
    await e.submit(submit("train2", "3g.20gb", "train"))
    assert await until(lambda: _reason_starts(e, "train2", "capacity"))
    assert await e.all_in(pinned, "running")


async def _reason_starts(e: Env, job: str, prefix: str) -> bool:
    return (await e.reason(job)).startswith(prefix)


async def test_a_tenant_over_its_quota_waits_with_reason_quota_and_starts_when_its_usage_drops(
    env: Env,
) -> None:
    e = env
    await e.submit(submit("q1", "1g.5gb", "small"))
    assert await until(lambda: e.all_in(["q1"], "running"))
    await e.submit(submit("q2", "2g.10gb", "small"))  # 1 + 2 compute slices > quota 2
    assert await until(lambda: _reason_starts(e, "q2", "quota"))
    assert (await e.states(["q2"]))["q2"] == "pending"  # waits, not rejected
    view = await clusterview.read(e.ns.state, e.stack.balancer.geometry)  # what `migsched status` shows
    assert view.reasons["q2"].startswith("quota")
    await e.ex.exit(["q1"])
    assert await until(lambda: e.all_in(["q2"], "running"))


async def test_a_borrower_uses_idle_cohort_quota_and_the_lender_reclaims_it_by_preemption(env: Env) -> None:
    e = env
    await e.submit(submit("b1", "3g.20gb", "borrower"), submit("b2", "3g.20gb", "borrower"))
    # b2 takes the borrower above its nominal 3 compute slices: borrowed from the lender's idle quota
    assert await until(lambda: e.all_in(["b1", "b2"], "running"))
    assert e.stack.balancer.ledger.book.borrowed("borrower")

    await e.submit(submit("l1", "3g.20gb", "lender"))  # within the lender's own quota: reclaim
    assert await until(lambda: e.all_in(["l1"], "running"))
    st = await e.states(["b1", "b2"])
    assert sorted(st.values()) == ["pending", "running"]
    victim = next(j for j, s in st.items() if s == "pending")
    assert (await e.ns.state.history(victim))[-1].reason.startswith("preempted by l1")
    assert not e.stack.balancer.ledger.book.borrowed("borrower")
    assert await _audit(e) == []


async def test_an_unknown_priority_class_is_rejected_with_its_reason(env: Env) -> None:
    e = env
    await e.submit(submit("u1", "1g.5gb", "serve", klass="no-such-class"))
    assert await until(lambda: e.all_in(["u1"], "rejected"))
    assert "no-such-class" in await e.reason("u1")


async def test_an_invalid_tenancy_edit_is_ignored_and_a_valid_one_applies(env: Env, tmp_path: Path) -> None:
    e = env
    path = tmp_path / "tenancy.toml"
    path.write_text(TENANCY + "\n[tenants.bad]\nquota = { compute_slices = -1 }\n")
    await asyncio.sleep(0.6)
    await e.submit(submit("r1", "1g.5gb", "small"))
    assert await until(lambda: e.all_in(["r1"], "running"))
    path.write_text(TENANCY.replace("quota = { compute_slices = 2 }", "quota = { compute_slices = 1 }"))
    led = e.stack.balancer.ledger
    assert await until(lambda: _async(led.tenancy.quotas.tenant("small").nominal("compute_slices") == 1))
    await e.submit(submit("r2", "1g.5gb", "small"))
    assert await until(lambda: _reason_starts(e, "r2", "quota"))


async def _async(v: bool) -> bool:
    return v


async def test_a_burst_in_one_batch_never_takes_a_tenant_above_its_quota(env: Env) -> None:
    e = env
    burst = [f"k{n}" for n in range(4)]
    await e.ns.bus.publish_batch(
        [Outgoing(e.ns.bus.subjects.jobs_submit, submit(j, "1g.5gb", "small")) for j in burst]
    )
    assert await until(lambda: _count(e, burst, "running", 2))
    await asyncio.sleep(0.5)
    st = await e.states(burst)
    assert sorted(st.values()) == ["pending", "pending", "running", "running"]
    for j in (j for j, s in st.items() if s == "pending"):
        assert (await e.reason(j)).startswith("quota")


async def _count(e: Env, jobs: list[str], state: str, n: int) -> bool:
    return sum(s == state for s in (await e.states(jobs)).values()) == n
