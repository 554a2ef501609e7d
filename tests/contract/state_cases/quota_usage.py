"""Tenants' usage counters and the quota check of ``reserve`` (``Reservation.limits``, ``lua/reserve.lua``),
written once against the store interface: ``tests/contract/test_state_store.py`` runs the scenarios on
``MemoryState`` and on ``RedisState``.

A reservation with a tenant adds its charge to the shard's counters; the job gives it back, once, when it leaves
the active states (ended, re-queued, preempted, lost with its node). A reservation that would take its tenant,
or its tenant's cohort, past a limit is refused (``quota``) and changes nothing, so that balancer replicas
deciding from books a moment old cannot together overshoot a quota."""

from __future__ import annotations

from typing import Any

from shared.state import Eviction, Reservation, StoredInstance, audit
from shared.state.model import QuotaLimit
from tests.contract.state_cases.expiry import GEO, NOW, P1, gpu, new

ONE = {"nvidia.com/mig-1g.5gb": 1.0}
R = "nvidia.com/mig-1g.5gb"


def _held(limit: float | None, nominal: float = 0.0, members: tuple[str, ...] = (),
          cohort_cap: float = 0.0) -> tuple[QuotaLimit, ...]:
    return (QuotaLimit(resource=R, cap=limit, nominal=nominal, members=members, cohort_cap=cohort_cap),)


async def _reserve(store: Any, job: str, inst: StoredInstance, tenant: str,
                   limits: tuple[QuotaLimit, ...] = (), victims: tuple[Eviction, ...] = ()) -> Any:
    gid = inst.id.split(":", 1)[0]
    (g,) = await store.get_gpus([gid])
    return await store.reserve(
        Reservation(job_id=job, gpu_id=gid, expected_ver=g.ver, instance=inst, action="create",
                    max_count=P1.max_count, spec=b"{}", submitted_at=NOW, tenant=tenant, usage=ONE,
                    limits=limits, victims=victims, prio=5),
        NOW,
    )


async def _running(store: Any, job: str, inst: StoredInstance, tenant: str) -> None:
    res = await _reserve(store, job, inst, tenant)
    assert res.ok, res
    assert await store.mark_running(job, inst.id, NOW, f"place:{job}:{res.detail}", int(res.detail), "n1",
                                    inst) == "ok"


async def a_tenants_job_is_counted_while_active_and_given_back_once(store: Any) -> None:
    await store.register_node("n1", [gpu(0)], NOW, "reg-1")
    inst = new("j1", 0)
    await _running(store, "j1", inst, "team-a")
    assert await store.tenant_usage(0) == {"team-a": ONE}
    assert (await store.release("j1", "completed", "exit 0", NOW + 5, inst.id)).status == "ok"
    assert await store.tenant_usage(0) == {}
    await store.release("j1", "completed", "exit 0", NOW + 6, inst.id)  # a replayed exit gives nothing back twice
    assert await store.tenant_usage(0) == {}
    assert await audit(store, GEO) == []


async def a_reservation_past_its_tenants_limit_changes_nothing(store: Any) -> None:
    await store.register_node("n1", [gpu(0)], NOW, "reg-1")
    await _running(store, "j1", new("j1", 0), "team-a")
    (before,) = await store.get_gpus(["n1/0"])
    res = await _reserve(store, "j2", new("j2", 0, start=1), "team-a", _held(1.0))
    assert res.status == "quota" and "team-a" in res.detail, res
    (after,) = await store.get_gpus(["n1/0"])
    assert after.ver == before.ver and after.instances == before.instances
    assert await store.job("j2") is None
    assert await store.tenant_usage(0) == {"team-a": ONE}
    # another tenant, and the same one with room, are placed
    assert (await _reserve(store, "j3", new("j3", 0, start=2), "team-b", _held(1.0))).ok
    assert (await _reserve(store, "j2", new("j2", 0, start=1), "team-a", _held(2.0))).ok
    assert await store.tenant_usage(0) == {"team-a": {R: 2.0}, "team-b": ONE}
    assert await audit(store, GEO) == []


async def a_cohort_lends_only_what_its_members_leave_unused(store: Any) -> None:
    await store.register_node("n1", [gpu(0)], NOW, "reg-1")
    cohort = ("team-a", "team-b")
    await _running(store, "a1", new("a1", 0), "team-a")
    await _running(store, "b1", new("b1", 0, start=1), "team-b")
    # team-a borrowing a second one: the cohort's quotas (1 + 1) are all in use
    lent = _held(None, nominal=1.0, members=cohort, cohort_cap=2.0)
    res = await _reserve(store, "a2", new("a2", 0, start=2), "team-a", lent)
    assert res.status == "quota" and "cohort" in res.detail, res
    assert (await store.release("b1", "completed", "exit 0", NOW + 5, new("b1", 0, start=1).id)).status == "ok"
    assert (await _reserve(store, "a2", new("a2", 0, start=2), "team-a", lent)).ok
    assert await store.tenant_usage(0) == {"team-a": {R: 2.0}}
    assert await audit(store, GEO) == []


async def preempting_a_tenants_own_job_frees_its_charge_for_the_new_one(store: Any) -> None:
    await store.register_node("n1", [gpu(0)], NOW, "reg-1")
    low = new("low", 0)
    await _running(store, "low", low, "team-a")
    victim = Eviction(job_id="low", instance_id=low.id, reason="preempted by high")
    res = await _reserve(store, "high", new("high", 0, start=1), "team-a", _held(1.0), (victim,))
    assert res.ok, res
    assert (await store.job("low")).state == "pending"
    assert await store.tenant_usage(0) == {"team-a": ONE}
    assert await audit(store, GEO) == []


async def a_requeued_or_lost_job_gives_its_charge_back_and_is_charged_again_when_placed(store: Any) -> None:
    await store.register_node("n1", [gpu(0), gpu(1)], NOW, "reg-1")
    res = await _reserve(store, "j1", new("j1", 0), "team-a")
    assert res.ok
    failed = await store.fail_placement("j1", "command timed out", NOW + 1, 5, f"place:j1:{res.detail}")
    assert (await store.job("j1")).state == "pending", failed
    assert await store.tenant_usage(0) == {}
    await _running(store, "j1", new("j1", 1), "team-a")
    assert await store.tenant_usage(0) == {"team-a": ONE}
    await store.node_lost("n1", NOW + 2, "heartbeat missed")
    assert (await store.job("j1")).state == "pending"
    assert await store.tenant_usage(0) == {}
    assert await audit(store, GEO) == []


async def a_recount_gives_the_counters_the_transitions_keep_and_a_later_exit_gives_back_once(store: Any) -> None:
    await store.register_node("n1", [gpu(0), gpu(1)], NOW, "reg-1")
    await _running(store, "a1", new("a1", 0), "team-a")
    await _running(store, "b1", new("b1", 0, start=1), "team-b")
    await _running(store, "b2", new("b2", 1), "team-b")
    assert (await store.release("b1", "completed", "exit 0", NOW + 5, new("b1", 0, start=1).id)).status == "ok"
    plain = await store.reserve(Reservation(job_id="p1", gpu_id="n1/1", expected_ver=(await store.get_gpus(
        ["n1/1"]))[0].ver, instance=new("p1", 1, start=1), action="create", max_count=P1.max_count, spec=b"{}",
        submitted_at=NOW), NOW)
    assert plain.ok  # no tenant: never counted
    kept = await store.tenant_usage(0)
    assert await store.recount_usage(0) == 2
    assert await store.tenant_usage(0) == kept == {"team-a": ONE, "team-b": ONE}
    assert (await store.release("b2", "completed", "exit 0", NOW + 6, new("b2", 1).id)).status == "ok"
    assert await store.tenant_usage(0) == {"team-a": ONE}
    assert await audit(store, GEO) == []


CASES = [
    a_tenants_job_is_counted_while_active_and_given_back_once,
    a_reservation_past_its_tenants_limit_changes_nothing,
    a_cohort_lends_only_what_its_members_leave_unused,
    preempting_a_tenants_own_job_frees_its_charge_for_the_new_one,
    a_requeued_or_lost_job_gives_its_charge_back_and_is_charged_again_when_placed,
    a_recount_gives_the_counters_the_transitions_keep_and_a_later_exit_gives_back_once,
]
