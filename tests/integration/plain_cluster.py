"""What the integration tests of whole GPUs, shares and gangs share: a scripted cluster on the live services
(real NATS and Redis), its jobs' states and the audit."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings, until
from shared.events import Demand, JobSubmit, now
from shared.mig.geometry import default_geometry
from shared.state import audit

GEO = default_geometry()


def submit(job: str, demand: Demand, tenant: str = "default") -> JobSubmit:
    return JobSubmit(id=f"s-{job}", job_id=job, demand=demand, tenant=tenant, submitted_at=now())




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


@contextlib.asynccontextmanager
async def scripted_cluster(
    prefix: str, nats_url: str, redis_url: str, nodes: Mapping[str, Mapping[str, Any]], **stack: Any
) -> AsyncIterator[Env]:
    """The services (``stack``: their settings, e.g. ``tenancy_file``, ``shards``) and one scripted executor per
    node (``nodes``: name -> ``ScriptedExecutor`` options), once the balancer's mirror holds every GPU; the first
    node is ``Env.ex``, all of them ``Env.nodes``."""
    settings = {k: v for k, v in stack.items() if k == "shards"}
    async with Namespace(make_settings(prefix, nats_url, redis_url, **settings)) as ns:
        services = Stack(prefix, nats_url, redis_url, **stack)
        await services.start()
        executors = [ScriptedExecutor(ns.bus, name, **opts) for name, opts in nodes.items()]
        for ex in executors:
            await ex.start()
        e = Env(ns, services, executors[0])
        e.nodes = executors
        assert await until(lambda: mirror_has(services, sum(ex.gpus for ex in executors)))
        yield e
        for ex in executors:
            await ex.stop()
        await services.stop()


def env_of(gpus: int, plain: dict[int, int], tenancy: bool = False) -> Callable[..., Any]:
    @pytest.fixture
    async def fixture(prefix: str, nats_url: str, redis_url: str, tmp_path: Path) -> AsyncIterator[Env]:
        extra: dict[str, Any] = {}
        if tenancy:
            (tmp_path / "tenancy.toml").write_text(TENANCY)
            extra = {"tenancy_file": str(tmp_path / "tenancy.toml")}
        async with scripted_cluster(prefix, nats_url, redis_url, {"n1": {"gpus": gpus, "plain": plain}},
                                    **extra) as e:
            yield e

    return fixture


async def mirror_has(stack: Stack, n: int) -> bool:
    """Whether the balancer's mirrors (every shard's) hold ``n`` GPUs."""
    return sum(len(m) for m in stack.balancer.mirrors) >= n


def routed(reason: str) -> float:
    """``migsched_jobs_routed_total{reason}`` as this process's balancer counted it."""
    return REGISTRY.get_sample_value("migsched_jobs_routed_total", {"reason": reason}) or 0.0


def in_blocks(blocks: dict[str, str], gpus: int = 2) -> dict[str, dict[str, object]]:
    """Nodes of ``gpus`` whole GPUs each, labelled with their block."""
    plain = dict.fromkeys(range(gpus), 0)
    return {n: {"gpus": gpus, "plain": plain, "labels": {"block": b}} for n, b in blocks.items()}
