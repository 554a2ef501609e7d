"""The consumers off the submit -> command path (what nodes report or are told, the planner's exit hints) wait
``MIGSCHED_BACKGROUND_LINGER_S`` for the rest of a burst when it is set; the ones on it keep
``MIGSCHED_BATCH_LINGER_S``, and so do all of them by default (a longer linger holds each slot longer)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from services.balancer.service import Balancer
from services.executor.config import ExecutorSettings
from services.executor.service import Executor
from services.executor.sim_backend import SimBackend
from services.migration_planner.service import MigrationPlanner
from services.registry.service import NodeRegistry
from shared.bus import Consumer, MemoryBus
from shared.settings import BalancerSettings, MigrationPlannerSettings, RegistrySettings, Settings, load
from shared.state.memory_store import MemoryState

pytestmark = pytest.mark.unit

SLOW, FAST = 0.04, 0.001


def _lingers(service: Any) -> dict[str, float]:
    return {c.durable.rsplit("-", 1)[0] if c.ephemeral else c.durable: c.linger_s for c in service.consumers()}


def _settings(cls: type[Any]) -> Any:
    return cls(batch_linger_s=FAST, background_linger_s=SLOW)


def test_the_node_registry_lingers_longer_on_node_reports_and_heartbeats_than_on_placements() -> None:
    st = _settings(RegistrySettings)
    lingers = _lingers(NodeRegistry(st, MemoryBus(st), MemoryState()))
    assert lingers["registry-report"] == SLOW and lingers["registry-heartbeat"] == SLOW
    assert "partitioner-placed" not in lingers  # the balancer sends every place command itself
    assert lingers["partitioner-cancel"] == FAST and lingers["partitioner-migrate"] == FAST


def test_the_migration_planner_lingers_longer_on_its_exit_hints() -> None:
    st = dataclasses.replace(_settings(MigrationPlannerSettings), policy="paper")
    assert set(_lingers(MigrationPlanner(st, MemoryBus(st), MemoryState())).values()) == {SLOW}


def test_under_a_policy_that_does_not_migrate_the_planner_hears_no_exits_and_plans_nothing() -> None:
    st = _settings(MigrationPlannerSettings)  # the default policy, migsched, does not migrate
    planner = MigrationPlanner(st, MemoryBus(st), MemoryState())
    assert planner.consumers() == []
    assert [name for name, _, _ in planner.periodic()] == ["heap-trim"]


def test_the_balancer_keeps_the_short_linger_on_every_consumer() -> None:
    st = _settings(BalancerSettings)
    lingers = _lingers(Balancer(st, MemoryBus(st), MemoryState()))
    assert lingers and set(lingers.values()) == {FAST}


def test_an_executor_lingers_longer_on_its_commands() -> None:
    st = dataclasses.replace(_settings(ExecutorSettings), node="n1")
    ex = Executor(MemoryBus(st), SimBackend(node="n1", models=["A100-40GB"]), st, "n1")
    assert ex.command_consumer().linger_s == SLOW


def test_by_default_the_consumers_off_the_path_linger_as_long_as_the_others() -> None:
    st = RegistrySettings(batch_linger_s=FAST)
    assert st.off_path_linger_s == FAST
    assert set(_lingers(NodeRegistry(st, MemoryBus(st), MemoryState())).values()) == {FAST}
    assert load(Settings, {"MIGSCHED_BACKGROUND_LINGER_S": "0"}).off_path_linger_s == 0.0  # 0: no linger at all


def test_a_consumer_without_its_own_linger_takes_the_bus_setting() -> None:
    st = _settings(Settings)

    async def handler(ds: list[Any]) -> None:
        return None

    assert Consumer(MemoryBus(st), "JOBS", "d", "jobs.submit", handler).linger_s == FAST
    assert Consumer(MemoryBus(st), "JOBS", "d", "jobs.submit", handler, linger_s=0.0).linger_s == 0.0
