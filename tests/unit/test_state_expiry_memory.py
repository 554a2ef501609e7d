"""Ended jobs forgotten after their retention, in the in-memory store: the scenarios of
the scenarios of ``tests/contract/state_cases/expiry.py`` (run on both stores by ``tests/contract/``); the audit's rule
on ended jobs; the node registry's periodic sweep."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from services.registry import expiry
from services.registry.service import NodeRegistry
from shared.bus import MemoryBus
from shared.mig.geometry import default_geometry
from shared.settings import RegistrySettings, load
from shared.state import JobRecord
from shared.state.check import check_state
from shared.state.memory_store import MemoryState
from tests.contract.state_cases.expiry import NOW

pytestmark = pytest.mark.unit
GEO = default_geometry()


def _done_findings(jobs: list[JobRecord], done: set[str]) -> list[tuple[str, str]]:
    return [(v.subject, v.detail) for v in check_state(GEO, [], jobs, set(), None, done) if v.kind == "done"]


def test_the_audit_flags_a_job_listed_as_ended_that_is_not_terminal_or_unknown() -> None:
    jobs = [JobRecord(job_id="ok", state="finished"), JobRecord(job_id="live", state="pending")]
    assert _done_findings(jobs, {"ok", "live", "gone"}) == [
        ("gone", "listed as ended but unknown"),
        ("live", "listed as ended but pending"),
    ]
    assert _done_findings(jobs, {"ok"}) == []


def test_the_audit_does_not_miss_an_ended_job_that_was_expired() -> None:
    # expired jobs are absent from the jobs and from the ended list alike: nothing to report
    assert check_state(GEO, [], [JobRecord(job_id="recent", state="cancelled")], set(), b"", {"recent"}) == []


def _registry(store: MemoryState, retention_s: float, cap: int = 0) -> NodeRegistry:
    settings = load(RegistrySettings, {}, job_retention_s=retention_s, job_retention_max=cap, shards=store.shards)
    return NodeRegistry(settings, MemoryBus(settings), store)


async def test_the_registry_sweep_repeats_until_every_expired_job_of_every_shard_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(expiry, "EXPIRE_LIMIT", 2)
    store = MemoryState(shards=2)
    old = [f"old{n}" for n in range(7)]
    for job in [*old, "recent"]:
        await store.enqueue(job, b"{}", 0, NOW, "no room", NOW)
    for job in old:
        await store.cancel(job, "by request", NOW)
    await store.cancel("recent", "by request", 10.0**12)  # ended in the future: inside any retention
    p = _registry(store, 60.0).expiry
    assert await p.expire_jobs() == 7
    assert [await store.job(j) for j in old] == [None] * 7
    assert (await store.job("recent")).state == "cancelled"  # type: ignore[union-attr]
    assert await p.expire_jobs() == 0


async def test_the_registry_sweep_forgets_the_routes_of_the_jobs_it_expired_and_keeps_the_others() -> None:
    store = MemoryState(shards=2)
    homes = {j: store.job_shard(j) for j in (f"j{n}" for n in range(20))}
    gone, alive = [j for j, s in homes.items() if s == 0][:2]
    await store.route({gone: 1, alive: 1}, NOW)
    for job in (gone, alive):
        await store.enqueue(job, b"{}", 0, NOW, "no room", NOW)
    await store.cancel(gone, "by request", NOW)
    assert await _registry(store, 60.0).expiry.expire_jobs() == 1
    assert store.job_shard(gone) == 0 and store.job_shard(alive) == 1
    assert (await store.job(alive)).state == "pending"  # type: ignore[union-attr]


def test_the_registry_sweeps_only_when_a_retention_or_a_cap_is_set() -> None:
    store = MemoryState()
    assert "expire-jobs" in [name for name, _, _ in _registry(store, 86400.0).periodic()]
    assert "expire-jobs" not in [name for name, _, _ in _registry(store, 0.0).periodic()]
    assert "expire-jobs" in [name for name, _, _ in _registry(store, 0.0, 10).periodic()]


def test_the_job_retention_is_read_from_the_environment_and_defaults_to_the_streams_max_age() -> None:
    assert load(RegistrySettings, {}).job_retention_s == load(RegistrySettings, {}).stream_max_age_s
    assert load(RegistrySettings, {"MIGSCHED_JOB_RETENTION_S": "3600"}).job_retention_s == 3600.0


async def test_the_registry_sweep_caps_the_ended_jobs_kept_but_spares_those_inside_the_redelivery_horizon() -> None:
    store = MemoryState()
    p = _registry(store, 0.0, cap=2).expiry
    settings = p.settings
    assert settings.redelivery_horizon_s == settings.duplicate_window_s + settings.max_deliver * settings.ack_wait_s
    jobs = [f"old{n}" for n in range(4)] + ["fresh"]
    for job in jobs:
        await store.enqueue(job, b"{}", 0, NOW, "no room", NOW)
    for n, job in enumerate(jobs[:4]):
        await store.cancel(job, "by request", NOW + n)  # ended long ago
    await store.cancel("fresh", "by request", 10.0**12)  # ends in the future: inside the horizon
    expired = REGISTRY.get_sample_value("migsched_jobs_expired_total") or 0.0
    assert await p.expire_jobs() == 3  # five ended, two kept: the three oldest go
    assert REGISTRY.get_sample_value("migsched_jobs_expired_total") == expired + 3  # operators see the cap work
    assert [await store.job(j) is None for j in jobs] == [True, True, True, False, False]
    assert await p.expire_jobs() == 0
    # a cap of one would take 'old3' too, but never 'fresh'
    p = _registry(store, 0.0, cap=1).expiry
    assert await p.expire_jobs() == 1
    assert await p.expire_jobs() == 0
    assert (await store.job("fresh")).state == "cancelled"  # type: ignore[union-attr]


def test_the_cap_on_ended_jobs_is_read_from_the_environment() -> None:
    assert load(RegistrySettings, {}).job_retention_max == 1_000_000
    assert load(RegistrySettings, {"MIGSCHED_JOB_RETENTION_MAX": "5"}).job_retention_max == 5


def test_the_duplicate_window_is_twice_the_ack_wait_unless_set_and_the_horizon_follows_it() -> None:
    default = load(RegistrySettings, {})
    assert default.duplicate_window_s == 60.0 and default.redelivery_horizon_s == 60.0 + 5 * 30.0
    longer = load(RegistrySettings, {"MIGSCHED_ACK_WAIT_S": "90"})
    assert longer.duplicate_window_s == 180.0
    fixed = load(RegistrySettings, {"MIGSCHED_DUP_WINDOW_S": "20", "MIGSCHED_ACK_WAIT_S": "90"})
    assert fixed.duplicate_window_s == 20.0 and fixed.redelivery_horizon_s == 20.0 + 5 * 90.0
