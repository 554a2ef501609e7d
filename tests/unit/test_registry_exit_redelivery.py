"""A job's exit goes out once its release is applied, even when the publish failed and the report comes back
counted as a first delivery (a consumer's new leader after a NATS server loss may not know of the first one):
the store keeps the id of the report that released the job, and only that report brings its exit out again."""

from __future__ import annotations

from typing import Any

import pytest

from services.registry.service import NodeRegistry
from shared.bus import MemoryBus
from shared.events import JobExit, JobExited, now
from shared.settings import RegistrySettings, load
from shared.state.memory_store import MemoryState
from tests.contract.state_cases.earlier_exit import IDLE, with_idle_instance
from tests.contract.state_cases.late_run import NOW, place, start

pytestmark = pytest.mark.unit


class _Delivery:
    ctx = None

    def __init__(self, deliveries: int) -> None:
        self.deliveries = deliveries


def _exited(report: str) -> JobExited:
    return JobExited(id=report, node="n1", at=now(), job_id="j1", gpu_index=0, instance_id=IDLE.id,
                     started_by="place:j1:0")


async def _released() -> tuple[NodeRegistry, MemoryState]:
    store = MemoryState()
    await with_idle_instance(store)
    attempt = await place(store, "j1", IDLE, "reuse")
    assert await start(store, "j1", IDLE, attempt) == "ok"
    assert (await store.release("j1", "completed", "exit 0", NOW, IDLE.id, "n1", attempt, "exit-1")).status == "ok"
    st = load(RegistrySettings, env={}, metrics_port=0)
    return NodeRegistry(st, MemoryBus(st), store), store


async def _out(reg: NodeRegistry, store: MemoryState, report: str, deliveries: int) -> list[Any]:
    res = await store.release("j1", "completed", "exit 0", NOW, IDLE.id, "n1", 0, report)
    return reg.reports._exit_out(_Delivery(deliveries), _exited(report), res, now())  # type: ignore[arg-type]


async def test_the_report_that_released_the_job_redelivered_as_a_first_delivery_publishes_its_exit_again() -> None:
    reg, store = await _released()
    out = await _out(reg, store, "exit-1", deliveries=1)
    assert [type(o.msg) for o in out] == [JobExit]
    assert out[0].msg.id == f"exit:j1:{IDLE.id}"  # the id of the first publish: the stream drops a duplicate


async def test_another_report_of_the_same_instance_publishes_nothing_however_often_it_comes() -> None:
    reg, store = await _released()
    assert await _out(reg, store, "exit-2", deliveries=1) == []
    assert await _out(reg, store, "exit-2", deliveries=3) == []
