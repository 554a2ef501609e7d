"""The read-back of skipped submits and cancels runs only where a consumer can change leader: on replicated
streams."""

from __future__ import annotations

from typing import Any

import pytest

from services.balancer.service import Balancer
from services.registry.service import NodeRegistry
from shared.bus import MemoryBus
from shared.settings import BalancerSettings, RegistrySettings, load
from shared.state.memory_store import MemoryState

pytestmark = pytest.mark.unit


def _tasks(cls: type[Any], settings_cls: type[Any], replicas: int) -> set[str]:
    st = load(settings_cls, env={}, metrics_port=0, stream_replicas=replicas)
    return {name for name, _, _ in cls(st, MemoryBus(st), MemoryState()).periodic()}


@pytest.mark.parametrize(("cls", "settings_cls", "task"), [
    (Balancer, BalancerSettings, "missed-submits"),
    (NodeRegistry, RegistrySettings, "missed-cancels"),
])
def test_a_service_reads_back_only_when_its_streams_are_replicated(cls: type[Any], settings_cls: type[Any],
                                                                   task: str) -> None:
    assert task in _tasks(cls, settings_cls, 3)
    assert task not in _tasks(cls, settings_cls, 1)
