"""A registration that finds a job running where the state does not hold it, written once against the store interface:
``tests/contract/test_state_store.py`` runs the scenarios on ``MemoryState`` and on ``RedisState``
(``lua/node.lua``).

Such an instance is never adopted idle: it stays ``retiring`` with the job (occupied, never reused), the
registration lists the job in ``stops``, and ``node_stopped`` idles it once the node no longer runs it."""

from __future__ import annotations

from typing import Any

from shared.mig.geometry import default_geometry
from shared.state import Reservation, StoredInstance, audit
from shared.state.model import RETIRING

GEO = default_geometry()
A100 = GEO.model("A100-40GB")
NOW = 1000.0
P1 = A100.profile("1g.5gb")


def gpu(index: int = 0, **insts: str | None) -> dict[str, Any]:
    """GPU ``n1/<index>`` in MIG mode; ``insts``: 1g.5gb instances by start (``s<start>``) -> the job the node
    reports on it (None: idle)."""
    out = []
    for key, job in insts.items():
        start = int(key[1:])
        i: dict[str, Any] = {"id": f"n1/{index}:1g.5gb@{start}", "profile": "1g.5gb", "start": start,
                             "size": P1.memory_slices, "compute": P1.compute_slices}
        if job:
            i["job"] = job
        out.append(i)
    return {"id": f"n1/{index}", "index": index, "model": "A100-40GB", "mig": True, "healthy": True,
            "uuid": f"GPU-{index}", "instances": out, "replicas": 0, "jobs": []}


async def inst(store: Any, iid: str, gid: str = "n1/0") -> StoredInstance:
    (g,) = await store.get_gpus([gid])
    return next(i for i in g.instances if i.id == iid)


async def reuse(store: Any, job: str, iid: str, gid: str = "n1/0") -> Any:
    (g,) = await store.get_gpus([gid])
    i = next(x for x in g.instances if x.id == iid)
    target = StoredInstance(id=iid, profile=i.profile, start=i.start, size=i.size, compute=i.compute)
    return await store.reserve(
        Reservation(job_id=job, gpu_id=gid, expected_ver=g.ver, instance=target, action="reuse",
                    max_count=P1.max_count, spec=b"{}", submitted_at=NOW),
        NOW,
    )


async def clean(store: Any) -> None:
    assert await audit(store, GEO) == []


async def a_new_gpu_running_an_unknown_job_keeps_its_instance_until_the_job_is_stopped(store: Any) -> None:
    res = await store.register_node("n1", [gpu(s0="ghost", s1=None)], NOW, "reg-1")
    assert [tuple(x) for x in res["stops"]] == [("ghost", "n1/0", "n1/0:1g.5gb@0")]
    ghost = await inst(store, "n1/0:1g.5gb@0")
    assert (ghost.state, ghost.job) == ("retiring", "ghost")
    assert ghost.view().job_id == RETIRING  # no policy reuses or moves it
    assert (await inst(store, "n1/0:1g.5gb@1")).state == "idle"
    (g,) = await store.get_gpus(["n1/0"])
    assert g.busy_mask == ghost.mask  # its slices stay taken
    assert not (await reuse(store, "j1", "n1/0:1g.5gb@0")).ok
    await clean(store)
    # a destroy of it (had one been on its way) neither drops nor restores it
    assert await store.instance("restore", "n1", "n1/0", "n1/0:1g.5gb@0", NOW) == "noop"
    assert await store.instance("drop", "n1", "n1/0", "n1/0:1g.5gb@0", NOW) == "busy"
    # the node stopped it: idle and reusable
    assert (await store.node_stopped("n1", "ghost", NOW))["gpus"] == ["n1/0"]
    assert (await inst(store, "n1/0:1g.5gb@0")).state == "idle"
    assert (await store.node_stopped("n1", "ghost", NOW))["gpus"] == []  # once
    assert (await reuse(store, "j1", "n1/0:1g.5gb@0")).ok
    await clean(store)


async def a_re_registration_stops_an_unknown_job_on_an_idle_instance_but_keeps_the_states_own(
    store: Any,
) -> None:
    await store.register_node("n1", [gpu(s0=None, s1=None)], NOW, "reg-1")
    assert (await reuse(store, "j1", "n1/0:1g.5gb@1")).ok
    await store.mark_running("j1", "n1/0:1g.5gb@1", NOW)
    # the executor restarted and re-attached: it runs "ghost" on the idle instance and j1 where the state has it,
    # and a third instance it created for "ghost2" that the state never saw
    res = await store.register_node("n1", [gpu(s0="ghost", s1="j1", s2="ghost2")], NOW + 1, "reg-2")
    assert sorted(tuple(x) for x in res["stops"]) == [
        ("ghost", "n1/0", "n1/0:1g.5gb@0"), ("ghost2", "n1/0", "n1/0:1g.5gb@2")
    ]
    assert [(i.state, i.job) for i in sorted((await store.get_gpus(["n1/0"]))[0].instances, key=lambda i: i.id)] == [
        ("retiring", "ghost"), ("busy", "j1"), ("retiring", "ghost2")
    ]
    await clean(store)
    # registered again before the stop took effect: still held, stopped again
    res = await store.register_node("n1", [gpu(s0="ghost", s1="j1")], NOW + 2, "reg-3")
    assert [tuple(x) for x in res["stops"]] == [("ghost", "n1/0", "n1/0:1g.5gb@0")]
    assert (await inst(store, "n1/0:1g.5gb@0")).state == "retiring"
    assert (await store.job("j1")).state == "running"
    await clean(store)
    await store.node_stopped("n1", "ghost", NOW + 3)
    assert [(i.state, i.job) for i in (await store.get_gpus(["n1/0"]))[0].instances] == [
        ("idle", None), ("busy", "j1")
    ]
    await clean(store)


async def an_unknown_instance_where_a_reservation_is_re_queues_its_job_and_is_adopted(store: Any) -> None:
    # the node's own instance at slice 0, which no registration reported: a 1g reservation there is doomed
    await store.register_node("n1", [gpu()], NOW, "reg-1")
    (g,) = await store.get_gpus(["n1/0"])
    target = StoredInstance(id="n1/0:1g.5gb@0:j1", profile="1g.5gb", start=0, size=P1.memory_slices,
                            compute=P1.compute_slices)
    res = await store.reserve(
        Reservation(job_id="j1", gpu_id="n1/0", expected_ver=g.ver, instance=target, action="create",
                    max_count=P1.max_count, spec=b"{}", submitted_at=NOW), NOW)
    assert res.ok
    # the node re-registers (after refusing j1's command): its instance at 0 is adopted idle, j1 waits again
    res2 = await store.register_node("n1", [gpu(s0=None)], NOW + 1, "reg-2")
    assert res2["requeued"] == ["j1"] and res2["drift"] == []
    (j,) = await store.jobs(["j1"])
    assert j is not None and j.state == "pending" and j.reason == "node n1 holds n1/0:1g.5gb@0 where the reservation is"
    assert [(i.id, i.state) for i in (await store.get_gpus(["n1/0"]))[0].instances] == [("n1/0:1g.5gb@0", "idle")]
    # the refusal of the old attempt, arriving now, changes nothing
    assert (await store.fail_placement("j1", "refused", NOW + 2, 3, "place:j1:0", 0))[0] == "noop"
    await clean(store)


CASES = [
    a_new_gpu_running_an_unknown_job_keeps_its_instance_until_the_job_is_stopped,
    a_re_registration_stops_an_unknown_job_on_an_idle_instance_but_keeps_the_states_own,
    an_unknown_instance_where_a_reservation_is_re_queues_its_job_and_is_adopted,
]
