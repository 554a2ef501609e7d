"""A place command the state gave up on, applied late by its executor (docs/architecture.md, data flow step 6),
written once against the store interface: ``tests/contract/test_state_store.py`` runs the scenarios on
``MemoryState`` and on ``RedisState`` (``lua/mark_running.lua``, ``lua/fail_placement.lua``).

The command's ``cmd_done`` (``mark_running`` with the command's attempt) answers ``stop``; the instance of that
run stays ``retiring`` with the job until ``node_stopped``; the job's own placement and state are untouched."""

from __future__ import annotations

from typing import Any

from shared.mig.geometry import default_geometry
from shared.state import Reservation, StoredInstance, audit
from shared.state.model import RETIRING

GEO = default_geometry()
A100 = GEO.model("A100-40GB")
NOW = 1000.0
P1 = A100.profile("1g.5gb")


def gpu(index: int) -> dict[str, Any]:
    return {"id": f"n1/{index}", "index": index, "model": "A100-40GB", "mig": True, "healthy": True,
            "uuid": f"GPU-{index}", "instances": [], "replicas": 0, "jobs": []}


def new(job: str, index: int, start: int = 0) -> StoredInstance:
    """A 1g.5gb instance as the node registry names one it creates for ``job`` (``new_instance_id``)."""
    return StoredInstance(id=f"n1/{index}:1g.5gb@{start}:{job}", profile="1g.5gb", start=start,
                          size=P1.memory_slices, compute=P1.compute_slices)


async def place(store: Any, job: str, inst: StoredInstance, action: str = "create") -> int:
    """Reserve ``inst`` for ``job`` -> the attempt its place command is sent for (``place:<job>:<attempt>``)."""
    gid = inst.id.split(":", 1)[0]
    (g,) = await store.get_gpus([gid])
    res = await store.reserve(
        Reservation(job_id=job, gpu_id=gid, expected_ver=g.ver, instance=inst, action=action,  # type: ignore[arg-type]
                    max_count=P1.max_count, spec=b"{}", submitted_at=NOW),
        NOW,
    )
    assert res.ok, res
    return int(res.detail)


async def start(store: Any, job: str, inst: StoredInstance, attempt: int) -> str:
    """The place command's ``cmd_done`` as the registry applies it."""
    return str(await store.mark_running(job, inst.id, NOW, f"place:{job}:{attempt}", attempt, "n1", inst))


async def held(store: Any, gid: str) -> list[tuple[str, str, str | None]]:
    (g,) = await store.get_gpus([gid])
    return sorted((i.id, i.state, i.job) for i in g.instances)


async def clean(store: Any) -> None:
    assert await audit(store, GEO) == []


async def a_place_applied_after_its_time_out_is_stopped_and_holds_its_instance_until_the_node_confirms(
    store: Any,
) -> None:
    await store.register_node("n1", [gpu(0), gpu(1)], NOW, "reg-1")
    first, second = new("j1", 0), new("j1", 1)
    a0 = await place(store, "j1", first)
    # its command timed out: the placement failed (the created instance is forgotten), the job re-queued
    assert (await store.fail_placement("j1", "no result", NOW, 3, f"place:j1:{a0}", a0))[:2] == ("ok", "pending")
    assert await held(store, "n1/0") == []
    a1 = await place(store, "j1", second)
    assert a1 > a0
    assert await start(store, "j1", second, a1) == "ok"
    (g0,) = await store.get_gpus(["n1/0"])
    # the executor, restarted, applies the first command late and reports it
    assert await start(store, "j1", first, a0) == "stop"
    j = await store.job("j1")
    assert (j.state, j.gpu, j.inst, j.attempts) == ("running", "n1/1", second.id, a1)
    assert await held(store, "n1/0") == [(first.id, "retiring", "j1")]
    assert await held(store, "n1/1") == [(second.id, "busy", "j1")]
    (g,) = await store.get_gpus(["n1/0"])
    assert g.busy_mask == first.mask and g.ver > g0.ver  # taken: a decision made before cannot commit
    assert g.instances[0].view().job_id == RETIRING
    other = await store.reserve(
        Reservation(job_id="j2", gpu_id="n1/0", expected_ver=g.ver, instance=new("j2", 0), action="create",
                    max_count=P1.max_count, spec=b"{}", submitted_at=NOW),
        NOW,
    )
    assert not other.ok  # its slices are not offered to another job
    await clean(store)
    # the node confirms the stop: the instance idles, the job's real placement is untouched
    assert (await store.node_stopped("n1", "j1", NOW))["gpus"] == ["n1/0"]
    assert await held(store, "n1/0") == [(first.id, "idle", None)]
    assert await held(store, "n1/1") == [(second.id, "busy", "j1")]
    await clean(store)
    # the same cmd_done redelivered: stopped again (the same stop message), but not held again
    assert await start(store, "j1", first, a0) == "stop"
    assert await held(store, "n1/0") == [(first.id, "idle", None)]
    assert (await store.job("j1")).state == "running"
    await clean(store)


async def a_late_run_of_a_finished_job_does_not_revive_it_and_is_stopped(store: Any) -> None:
    await store.register_node("n1", [gpu(0), gpu(1)], NOW, "reg-1")
    first, second = new("j1", 0), new("j1", 1)
    a0 = await place(store, "j1", first)
    await store.fail_placement("j1", "no result", NOW, 3, f"place:j1:{a0}", a0)
    a1 = await place(store, "j1", second)
    assert await start(store, "j1", second, a1) == "ok"
    assert (await store.release("j1", "completed", "exit 0", NOW, second.id)).status == "ok"
    assert await start(store, "j1", first, a0) == "stop"
    j = await store.job("j1")
    assert (j.state, j.attempts) == ("finished", a1)
    assert await held(store, "n1/0") == [(first.id, "retiring", "j1")]
    await clean(store)
    # the stopped run's exit is stale: it ends nothing
    assert (await store.release("j1", "cancelled", "stopped", NOW, first.id)).status == "noop"
    assert (await store.job("j1")).state == "finished"
    await store.node_stopped("n1", "j1", NOW)
    assert await held(store, "n1/0") == [(first.id, "idle", None)]
    await clean(store)


async def the_start_report_of_the_current_attempt_after_the_exit_changes_nothing(store: Any) -> None:
    await store.register_node("n1", [gpu(0)], NOW, "reg-1")
    inst = new("j1", 0)
    a0 = await place(store, "j1", inst)
    assert (await store.release("j1", "completed", "exit 0", NOW, inst.id)).status == "ok"
    assert await start(store, "j1", inst, a0) == "noop"  # the same run, over already: nothing to stop
    assert (await store.job("j1")).state == "finished"
    assert await held(store, "n1/0") == [(inst.id, "idle", None)]
    await clean(store)


async def a_late_run_on_an_instance_reserved_for_another_job_is_stopped_without_touching_it(store: Any) -> None:
    await store.register_node("n1", [gpu(0), gpu(1)], NOW, "reg-1")
    await store.register_node("n1", [gpu(0) | {"instances": [
        {"id": "n1/0:1g.5gb@0", "profile": "1g.5gb", "start": 0, "size": P1.memory_slices,
         "compute": P1.compute_slices}]}, gpu(1)], NOW, "reg-2")
    idle = StoredInstance(id="n1/0:1g.5gb@0", profile="1g.5gb", start=0, size=P1.memory_slices,
                          compute=P1.compute_slices)
    a0 = await place(store, "j1", idle, "reuse")
    await store.fail_placement("j1", "no result", NOW, 3, f"place:j1:{a0}", a0)
    assert await held(store, "n1/0") == [(idle.id, "idle", None)]  # reused, so kept idle
    await place(store, "j2", idle, "reuse")
    assert await start(store, "j1", idle, a0) == "stop"
    assert await held(store, "n1/0") == [(idle.id, "reserved", "j2")]
    assert (await store.job("j1")).state == "pending"
    await clean(store)


async def a_late_run_on_the_instance_the_job_was_placed_on_again_is_that_placement(store: Any) -> None:
    await store.register_node("n1", [gpu(0)], NOW, "reg-1")
    await store.register_node("n1", [gpu(0) | {"instances": [
        {"id": "n1/0:1g.5gb@0", "profile": "1g.5gb", "start": 0, "size": P1.memory_slices,
         "compute": P1.compute_slices}]}], NOW, "reg-2")
    idle = StoredInstance(id="n1/0:1g.5gb@0", profile="1g.5gb", start=0, size=P1.memory_slices,
                          compute=P1.compute_slices)
    a0 = await place(store, "j1", idle, "reuse")
    await store.fail_placement("j1", "no result", NOW, 3, f"place:j1:{a0}", a0)
    a1 = await place(store, "j1", idle, "reuse")
    # one run per job and instance on a node: the late run is the one the new placement asks for
    assert await start(store, "j1", idle, a0) == "ok"
    assert await held(store, "n1/0") == [(idle.id, "busy", "j1")]
    assert await start(store, "j1", idle, a1) == "noop"
    await clean(store)


async def a_failure_of_an_older_attempt_leaves_the_current_placement_alone(store: Any) -> None:
    await store.register_node("n1", [gpu(0), gpu(1)], NOW, "reg-1")
    first, second = new("j1", 0), new("j1", 1)
    a0 = await place(store, "j1", first)
    await store.fail_placement("j1", "no result", NOW, 3, f"place:j1:{a0}", a0)
    await place(store, "j1", second)
    # the late command failed on the node (the job ran there already): not the current placement's failure
    assert (await store.fail_placement("j1", "already runs", NOW, 3, f"place:j1:{a0}", a0))[0] == "noop"
    j = await store.job("j1")
    assert (j.state, j.inst) == ("placing", second.id)
    assert await held(store, "n1/1") == [(second.id, "reserved", "j1")]
    await clean(store)


async def a_late_run_on_a_whole_gpu_is_stopped_unless_the_job_is_placed_on_that_node_now(store: Any) -> None:
    plain = [gpu(0) | {"mig": False}, gpu(1) | {"mig": False}]
    await store.register_node("n1", plain, NOW, "reg-1")
    await store.register_node("n2", [g | {"id": g["id"].replace("n1", "n2")} for g in plain], NOW, "reg-1")

    def whole(gid: str) -> StoredInstance:
        return StoredInstance(id=f"{gid}:gpu@0:j1", profile="gpu", start=0, size=8, compute=7, mig=False)

    async def reserve(gid: str) -> int:
        (g,) = await store.get_gpus([gid])
        res = await store.reserve(
            Reservation(job_id="j1", gpu_id=gid, expected_ver=g.ver, instance=whole(gid), action="create",
                        max_count=1, spec=b"{}", submitted_at=NOW),
            NOW,
        )
        assert res.ok, res
        return int(res.detail)

    def done(node: str, attempt: int) -> Any:
        # a plain binding's cmd_done reports no instance
        return store.mark_running("j1", "", NOW, f"place:j1:{attempt}", attempt, node, None)

    a0 = await reserve("n1/0")
    await store.fail_placement("j1", "no result", NOW, 3, f"place:j1:{a0}", a0)
    a1 = await reserve("n1/1")
    # on the node of the job's current placement the late run cannot be told from the current one: not stopped
    assert await done("n1", a0) == "ok"
    assert (await store.job("j1")).state == "running"
    await store.release("j1", "lost", "node lost", NOW)  # re-queued again
    a2 = await reserve("n2/0")
    assert a2 > a1
    assert await done("n1", a1) == "stop"  # elsewhere: stopped, nothing held (no instance is known)
    assert [i.state for i in (await store.get_gpus(["n1/1"]))[0].instances] == []
    j = await store.job("j1")
    assert (j.state, j.node) == ("placing", "n2")
    await clean(store)


async def an_exit_naming_no_instance_from_a_node_the_job_is_not_on_ends_nothing(store: Any) -> None:
    await store.register_node("n1", [gpu(0)], NOW, "reg-1")
    await store.register_node("n2", [gpu(0) | {"id": "n2/0"}], NOW, "reg-1")
    inst = StoredInstance(id="n2/0:1g.5gb@0:j1", profile="1g.5gb", start=0, size=P1.memory_slices,
                          compute=P1.compute_slices)
    a0 = await place(store, "j1", inst)
    assert await start(store, "j1", inst, a0) == "ok"
    # a stopped late run on n1 whose exit could not name its instance: not the run on n2
    res = await store.release("j1", "cancelled", "stopped", NOW, "", "n1")
    assert res.status == "stale"
    j = await store.job("j1")
    assert (j.state, j.node, j.inst) == ("running", "n2", inst.id)
    assert await held(store, "n2/0") == [(inst.id, "busy", "j1")]
    await clean(store)
    # the same report from the job's own node ends it
    assert (await store.release("j1", "completed", "exit 0", NOW, "", "n2")).status == "ok"
    assert (await store.job("j1")).state == "finished"
    assert await held(store, "n2/0") == [(inst.id, "idle", None)]
    await clean(store)


CASES = [
    a_place_applied_after_its_time_out_is_stopped_and_holds_its_instance_until_the_node_confirms,
    a_late_run_of_a_finished_job_does_not_revive_it_and_is_stopped,
    the_start_report_of_the_current_attempt_after_the_exit_changes_nothing,
    a_late_run_on_an_instance_reserved_for_another_job_is_stopped_without_touching_it,
    a_late_run_on_the_instance_the_job_was_placed_on_again_is_that_placement,
    a_failure_of_an_older_attempt_leaves_the_current_placement_alone,
    a_late_run_on_a_whole_gpu_is_stopped_unless_the_job_is_placed_on_that_node_now,
    an_exit_naming_no_instance_from_a_node_the_job_is_not_on_ends_nothing,
]
