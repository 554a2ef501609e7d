"""A job re-queued after a refused placement is decided again only after its back-off, which doubles with each
re-queue up to a cap; preemptions never delay a job, and a fresh submit never waits."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.balancer.backfill import Backfill, retry_wait
from services.balancer.waiting import Waiting
from shared.events import Demand, JobSubmit
from shared.settings import BalancerSettings, SettingsError, load
from shared.state.memory_store import MemoryState
from shared.state.model import JobRecord

pytestmark = pytest.mark.unit


def test_the_wait_doubles_with_each_requeue_up_to_the_cap_and_zero_turns_it_off() -> None:
    assert [retry_wait(n, 0.25, 5.0) for n in range(8)] == [0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert retry_wait(10_000, 0.25, 5.0) == 5.0
    assert retry_wait(3, 0.0, 5.0) == 0.0


def _record(job: str, attempts: int, preempted: int, updated: float) -> JobRecord:
    sub = JobSubmit(id=f"s-{job}", job_id=job, demand=Demand(kind="mig", profile="1g.5gb"), submitted_at=0.0)
    return JobRecord(job_id=job, state="pending", spec=msgspec.json.encode(sub), attempts=attempts,
                     preempted=preempted, updated=updated)


async def test_a_requeued_job_is_a_candidate_again_only_once_its_back_off_has_passed() -> None:
    state = MemoryState()
    for rec in (_record("refused-twice", 2, 0, 100.0), _record("preempted", 1, 1, 100.0),
                _record("never-placed", 0, 0, 100.0)):
        state._js(rec.job_id).jobs[rec.job_id] = rec
    settings = load(BalancerSettings, env={}, retry_backoff_s=0.25, retry_backoff_max_s=5.0)
    none: Any = None
    backfill = Backfill(settings, state, none, none, none, none, Waiting(), none, False, none, "balancer")
    ids = ["refused-twice", "preempted", "never-placed"]
    early = [c.submit.job_id for c in await backfill._candidates(ids, now=100.4)]
    assert early == ["preempted", "never-placed"]  # twice refused: 0.5 s to wait
    later = [c.submit.job_id for c in await backfill._candidates(ids, now=100.5)]
    assert later == ids


@pytest.mark.parametrize("var", ["MIGSCHED_RETRY_BACKOFF_S", "MIGSCHED_RETRY_BACKOFF_MAX_S"])
def test_a_negative_back_off_is_refused_with_the_variables_name(var: str) -> None:
    with pytest.raises(SettingsError, match="MIGSCHED_RETRY_BACKOFF"):
        load(BalancerSettings, env={var: "-1"})
