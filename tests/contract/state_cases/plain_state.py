"""Scenarios of whole-GPU gangs and time-sliced shares in the state store, written once against the store interface:
``tests/contract/test_state_store.py`` runs them on ``MemoryState`` and on ``RedisState`` (the Lua scripts), so the
two implementations must agree.

The node ``n1``: GPUs 0 and 1 not in MIG mode (whole-GPU jobs only), GPU 2 not in MIG mode and time-sliced
into 3 replicas, GPU 3 in MIG mode.
"""

from __future__ import annotations

from typing import Any

from shared.mig.geometry import default_geometry
from shared.state import Eviction, Reservation, SlotReservation, StoredInstance, audit

GEO = default_geometry()
A100 = GEO.model("A100-40GB")
NOW = 1000.0


def node_gpus(jobs: dict[int, list[str]] | None = None) -> list[dict[str, Any]]:
    jobs = jobs or {}

    def g(index: int, mig: bool, replicas: int = 0) -> dict[str, Any]:
        return {
            "id": f"n1/{index}",
            "index": index,
            "model": "A100-40GB",
            "mig": mig,
            "healthy": True,
            "uuid": f"GPU-{index}",
            "instances": [],
            "replicas": replicas,
            "jobs": jobs.get(index, []),
        }

    return [g(0, False), g(1, False), g(2, False, 3), g(3, True)]


async def setup(store: Any) -> None:
    await store.register_node("n1", node_gpus(), NOW)


def whole(gpu: str, job: str, prio: int = 0) -> StoredInstance:
    return StoredInstance(
        id=f"{gpu}:gpu@0:{job}", profile="gpu", start=0, size=8, compute=7, prio=prio, mig=False
    )


def share(gpu: str, job: str, replica: int) -> StoredInstance:
    return StoredInstance(id=f"{gpu}:shared@{replica}:{job}", profile="shared", start=replica, size=0, compute=0)


async def vers(store: Any, *gpus: str) -> list[int]:
    return [g.ver for g in await store.get_gpus(list(gpus))]


async def gang(store: Any, job: str, gpus: tuple[str, ...] = ("n1/0", "n1/1"), prio: int = 0,
               stale: str = "", victims: tuple[Eviction, ...] = ()) -> Any:
    """Reserve ``job`` on whole ``gpus``; ``stale``: that GPU's expected version is one behind."""
    v = await vers(store, *gpus)
    slots = [
        SlotReservation(gpu_id=g, expected_ver=ver - (g == stale), instance=whole(g, job, prio))
        for g, ver in zip(gpus, v, strict=True)
    ]
    first = slots[0]
    return await store.reserve(
        Reservation(
            job_id=job, gpu_id=first.gpu_id, expected_ver=first.expected_ver, instance=first.instance,
            action="create", max_count=1, extra=tuple(slots[1:]), spec=b"{}", prio=prio, submitted_at=NOW,
            victims=victims,
        ),
        NOW,
    )


async def take_share(store: Any, job: str, replica: int, gpu: str = "n1/2") -> Any:
    (ver,) = await vers(store, gpu)
    return await store.reserve(
        Reservation(job_id=job, gpu_id=gpu, expected_ver=ver, instance=share(gpu, job, replica),
                    action="create", max_count=1, spec=b"{}", submitted_at=NOW),
        NOW,
    )


async def clean(store: Any) -> None:
    assert [str(v) for v in await audit(store, GEO)] == []


# --- the scenarios ------------------------------------------------------------------------------------------
async def gang_reserves_every_gpu_and_the_job_remembers_them(store: Any) -> None:
    await setup(store)
    res = await gang(store, "g1")
    assert res.ok, res
    j = await store.job("g1")
    assert j.state == "placing" and j.node == "n1"
    assert j.slots == (("n1/0", "n1/0:gpu@0:g1"), ("n1/1", "n1/1:gpu@0:g1"))
    g0, g1 = await store.get_gpus(["n1/0", "n1/1"])
    assert [i.job for i in g0.instances] == ["g1"] and [i.job for i in g1.instances] == ["g1"]
    assert (await store.occupancy(0))[g0.pos] == 0xFF
    assert await store.mark_running("g1", "n1/0:gpu@0:g1", NOW + 1) == "ok"
    assert {i.state for g in await store.get_gpus(["n1/0", "n1/1"]) for i in g.instances} == {"busy"}
    await clean(store)


async def a_stale_version_on_one_gpu_aborts_the_whole_gang(store: Any) -> None:
    await setup(store)
    before = await store.get_gpus(["n1/0", "n1/1"])
    res = await gang(store, "g1", stale="n1/1")
    assert res.status == "conflict" and "n1/1" in res.detail
    assert await store.get_gpus(["n1/0", "n1/1"]) == before  # nothing written on either GPU
    assert await store.job("g1") is None
    await clean(store)


async def a_busy_gpu_in_the_gang_aborts_it_all(store: Any) -> None:
    await setup(store)
    assert (await gang(store, "a", gpus=("n1/1",))).ok
    before = await store.get_gpus(["n1/0", "n1/1"])
    res = await gang(store, "g1")
    assert res.status == "busy"
    assert await store.get_gpus(["n1/0", "n1/1"]) == before
    await clean(store)


async def release_frees_every_gpu_of_the_gang_once(store: Any) -> None:
    await setup(store)
    await gang(store, "g1")
    await store.mark_running("g1", "", NOW)
    vers_before = await vers(store, "n1/0", "n1/1")
    rel = await store.release("g1", "completed", "done", NOW + 2, "n1/0:gpu@0:g1")
    assert rel.status == "ok" and rel.state == "finished"
    assert rel.slots == (("n1/0", "n1/0:gpu@0:g1"), ("n1/1", "n1/1:gpu@0:g1"))
    assert [g.instances for g in await store.get_gpus(["n1/0", "n1/1"])] == [[], []]  # plain: removed
    assert await vers(store, "n1/0", "n1/1") == vers_before  # a release never moves the CAS version
    assert (await store.release("g1", "completed", "done", NOW + 3, "n1/0:gpu@0:g1")).status == "noop"
    assert (await gang(store, "g2")).ok  # the GPUs are free again
    await clean(store)


async def a_failed_placement_frees_every_gpu(store: Any) -> None:
    await setup(store)
    await gang(store, "g1")
    status, new_state, gpus, _ = await store.fail_placement("g1", "NVML", NOW + 1, max_attempts=3)
    assert (status, new_state, gpus) == ("ok", "pending", "n1/0,n1/1")
    assert [g.instances for g in await store.get_gpus(["n1/0", "n1/1"])] == [[], []]
    assert (await store.job("g1")).slots == ()
    await clean(store)


async def node_loss_requeues_the_gang_once(store: Any) -> None:
    await setup(store)
    await gang(store, "g1")
    await store.mark_running("g1", "", NOW)
    res = await store.node_lost("n1", NOW + 5, "missed heartbeats")
    assert res["requeued"] == ["g1"]
    j = await store.job("g1")
    assert j.state == "pending" and j.attempts == 1 and j.slots == () and j.gpu == ""
    assert [h.to for h in await store.history("g1")].count("pending") == 1
    await clean(store)


async def a_re_registration_keeps_reported_plain_jobs_and_frees_a_dropped_gang(store: Any) -> None:
    await setup(store)
    await gang(store, "g1")
    await store.mark_running("g1", "", NOW)
    await take_share(store, "s1", 0)
    await store.mark_running("s1", "", NOW)
    # the node still runs s1 on GPU 2 but reports g1 only on GPU 1: g1 is drift, re-queued once, all freed
    res = await store.register_node("n1", node_gpus({1: ["g1"], 2: ["s1"]}), NOW + 1, "reg-2")
    assert res["requeued"] == ["g1"]
    assert (await store.job("s1")).state == "running"
    g0, g1, g2 = await store.get_gpus(["n1/0", "n1/1", "n1/2"])
    assert g0.instances == [] and g1.instances == [] and [i.job for i in g2.instances] == ["s1"]
    assert g2.replicas == 3
    await clean(store)


async def shares_never_exceed_the_replicas(store: Any) -> None:
    await setup(store)
    for n in range(3):
        assert (await take_share(store, f"s{n}", n)).ok
    assert (await take_share(store, "again", 1)).status == "overlap"  # that replica is taken
    assert (await take_share(store, "s3", 3)).status == "count"  # only 3 replicas
    assert (await gang(store, "w", gpus=("n1/2",))).status == "busy"  # no whole job beside shares
    g2 = (await store.get_gpus(["n1/2"]))[0]
    assert sorted(i.start for i in g2.instances) == [0, 1, 2]
    assert (await store.occupancy(0))[g2.pos] == 0  # shares partition nothing
    await store.mark_running("s1", "", NOW)
    assert (await store.release("s1", "completed", "done", NOW + 1)).status == "ok"
    assert (await take_share(store, "s4", 1)).ok  # the freed replica is taken again
    await clean(store)


async def a_mig_slot_never_lands_on_a_plain_gpu_and_vice_versa(store: Any) -> None:
    await setup(store)
    p = A100.profile("3g.20gb")
    mig = StoredInstance(id="n1/0:3g.20gb@0:m", profile="3g.20gb", start=0, size=p.memory_slices,
                         compute=p.compute_slices)
    (v0, v3) = await vers(store, "n1/0", "n1/3")
    r = Reservation(job_id="m", gpu_id="n1/0", expected_ver=v0, instance=mig, action="create",
                    max_count=p.max_count, spec=b"{}", submitted_at=NOW)
    assert (await store.reserve(r, NOW)).status == "mode"
    assert (await gang(store, "w", gpus=("n1/3",))).status == "mode"
    assert (await take_share(store, "s", 0, gpu="n1/3")).status == "mode"
    r3 = Reservation(job_id="m", gpu_id="n1/3", expected_ver=v3,
                     instance=StoredInstance(id="n1/3:3g.20gb@0:m", profile="3g.20gb", start=0,
                                             size=p.memory_slices, compute=p.compute_slices),
                     action="create", max_count=p.max_count, spec=b"{}", submitted_at=NOW)
    assert (await store.reserve(r3, NOW)).ok
    await clean(store)


async def preempting_a_gang_frees_all_its_gpus(store: Any) -> None:
    await setup(store)
    await gang(store, "low", prio=1)
    await store.mark_running("low", "", NOW)
    victim = Eviction(job_id="low", instance_id="n1/1:gpu@0:low", reason="preempted by high")
    res = await gang(store, "high", gpus=("n1/0",), prio=9, victims=(victim,))
    assert res.ok, res
    low = await store.job("low")
    assert low.state == "pending" and low.preempted == 1 and low.slots == ()
    g0, g1 = await store.get_gpus(["n1/0", "n1/1"])
    assert [i.job for i in g0.instances] == ["high"] and g1.instances == []
    await clean(store)


async def a_victim_that_moved_on_refuses_the_preemption(store: Any) -> None:
    await setup(store)
    await gang(store, "low")  # placing, not running: not preemptible
    before = await store.get_gpus(["n1/0", "n1/1"])
    victim = Eviction(job_id="low", instance_id="n1/0:gpu@0:low", reason="x")
    assert (await gang(store, "high", gpus=("n1/0",), victims=(victim,))).status == "victim"
    assert await store.get_gpus(["n1/0", "n1/1"]) == before
    await clean(store)


async def a_cancelled_gang_stops_and_its_exit_frees_everything(store: Any) -> None:
    await setup(store)
    await gang(store, "g1")
    await store.mark_running("g1", "", NOW)
    c = await store.cancel("g1", "user", NOW + 1)
    assert c.status == "stop" and c.node == "n1"
    await store.release("g1", "cancelled", "stopped", NOW + 2, "n1/0:gpu@0:g1")
    assert [g.instances for g in await store.get_gpus(["n1/0", "n1/1"])] == [[], []]
    assert (await store.job("g1")).state == "cancelled"
    await clean(store)


async def a_job_on_a_plain_gpu_never_migrates(store: Any) -> None:
    await setup(store)
    await take_share(store, "s1", 0)
    await store.mark_running("s1", "", NOW)
    p = A100.profile("1g.5gb")
    (v3,) = await vers(store, "n1/3")
    target = StoredInstance(id="n1/3:1g.5gb@0:s1.x", profile="1g.5gb", start=0, size=p.memory_slices,
                            compute=p.compute_slices)
    b = store.batch()
    b.migrate_reserve("s1", "n1/2:shared@0:s1", "n1/3", v3, target, (), p.max_count, 0.0, "defrag", NOW + 1)
    assert (await b.run())[0][0] == "pinned"
    await clean(store)


async def a_jobs_expected_end_is_kept_on_its_instance_until_it_ends(store: Any) -> None:
    await setup(store)
    p = A100.profile("3g.20gb")
    (ver,) = await vers(store, "n1/3")
    inst = StoredInstance(id="n1/3:3g.20gb@4:m1", profile=p.name, start=4, size=p.memory_slices,
                          compute=p.compute_slices, ends=NOW + 600.0)
    res = await store.reserve(Reservation(job_id="m1", gpu_id="n1/3", expected_ver=ver, instance=inst,
                                          action="create", max_count=p.max_count, spec=b"{}", submitted_at=NOW), NOW)
    assert res.ok, res
    (g,) = await store.get_gpus(["n1/3"])
    assert [(i.job, i.ends) for i in g.instances] == [("m1", NOW + 600.0)]
    assert g.view().instances[0].ends_at == NOW + 600.0
    assert await store.mark_running("m1", inst.id, NOW + 1) == "ok"
    await store.release("m1", "completed", "done", NOW + 2, inst.id)
    (g,) = await store.get_gpus(["n1/3"])
    assert all(i.ends == 0.0 and i.job is None for i in g.instances)  # an idle instance expects nothing
    await clean(store)


async def the_balancers_holds_read_back_as_the_last_pass_put_them(store: Any) -> None:
    from shared.policy.reservation import Reservation as Hold

    assert await store.holds(0) == (0.0, [])
    hold = Hold(job_id="big", gpus=("n1/0", "n1/1"), node="n1", start=NOW + 60.0, reason="expected free in 60 s")
    await store.put_holds(0, [hold], NOW)
    assert await store.holds(0) == (NOW, [hold])
    await store.put_holds(0, [], NOW + 5)
    assert await store.holds(0) == (NOW + 5, [])


CASES = [
    a_jobs_expected_end_is_kept_on_its_instance_until_it_ends,
    the_balancers_holds_read_back_as_the_last_pass_put_them,
    gang_reserves_every_gpu_and_the_job_remembers_them,
    a_stale_version_on_one_gpu_aborts_the_whole_gang,
    a_busy_gpu_in_the_gang_aborts_it_all,
    release_frees_every_gpu_of_the_gang_once,
    a_failed_placement_frees_every_gpu,
    node_loss_requeues_the_gang_once,
    a_re_registration_keeps_reported_plain_jobs_and_frees_a_dropped_gang,
    shares_never_exceed_the_replicas,
    a_mig_slot_never_lands_on_a_plain_gpu_and_vice_versa,
    preempting_a_gang_frees_all_its_gpus,
    a_victim_that_moved_on_refuses_the_preemption,
    a_cancelled_gang_stops_and_its_exit_frees_everything,
    a_job_on_a_plain_gpu_never_migrates,
]
