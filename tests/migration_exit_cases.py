"""A job that ends while it is being moved, written once against the store interface:
``tests/unit/test_state_migration_exit_memory.py`` runs the cases on ``MemoryState``,
``tests/integration/test_state_migration_exit_lua.py`` on ``RedisState`` (``lua/release.lua``,
``lua/migrate.lua``).

The executor keeps a move's target only when the move took: a move that fails after creating the target
destroys it again, and a move of a job that already ended creates none. So the state drops a target created for
the move when the job's exit comes from the source copy (whether the abort comes before or after it), and
idles it when the exit comes from the target copy. Idling it in the first case left an instance the GPU did not
have: placements reused it and failed until jobs ran out of attempts (the 10-minute soak lost 24 of 600,000)."""

from __future__ import annotations

from typing import Any

from late_run_cases import NOW, clean, gpu, held, new, place, start

from shared.state import StoredInstance


def target(job: str) -> StoredInstance:
    """The partitioner's move target on n1/1 (``<gpu>:<profile>@<start>:<job>.m<stamp>``)."""
    return StoredInstance(id=f"n1/1:1g.5gb@6:{job}.m1", profile="1g.5gb", start=6, size=1, compute=1)


async def moving(store: Any, job: str) -> tuple[StoredInstance, StoredInstance]:
    """``job`` running on n1/0 and being moved to n1/1."""
    await store.register_node("n1", [gpu(0), gpu(1)], NOW, "reg-1")
    src = new(job, 0)
    attempt = await place(store, job, src)
    assert await start(store, job, src, attempt) == "ok"
    (g1,) = await store.get_gpus(["n1/1"])
    b = store.batch()
    b.migrate_reserve(job, src.id, "n1/1", g1.ver, target(job), (), 7, 120.0, "defrag", NOW)
    assert (await b.run())[0][0] == "ok"
    return src, target(job)


async def an_exit_from_the_source_during_a_move_drops_the_created_target(store: Any) -> None:
    src, _dst = await moving(store, "j1")
    assert (await store.release("j1", "completed", "exit 0", NOW + 1, src.id)).status == "ok"
    assert await held(store, "n1/1") == []  # the executor destroyed it (or never made it)
    assert await held(store, "n1/0") == [(src.id, "idle", None)]
    b = store.batch()
    b.migrate_finish("abort", "j1", "target exited", NOW + 2)  # the move's failure, after the exit
    assert (await b.run())[0][0] == "noop"
    assert await held(store, "n1/1") == []
    await clean(store)


async def an_abort_before_the_exit_drops_the_target_and_the_exit_then_frees_the_source(store: Any) -> None:
    src, _dst = await moving(store, "j2")
    b = store.batch()
    b.migrate_finish("abort", "j2", "source ended during the move", NOW + 1)
    assert (await b.run())[0][0] == "ok"
    assert (await store.release("j2", "completed", "exit 0", NOW + 2, src.id)).status == "ok"
    assert await held(store, "n1/1") == []
    assert await held(store, "n1/0") == [(src.id, "idle", None)]
    await clean(store)


async def an_exit_from_the_target_before_the_commit_leaves_the_target_idle(store: Any) -> None:
    src, dst = await moving(store, "j3")
    assert (await store.release("j3", "completed", "exit 0", NOW + 1, dst.id)).status == "ok"
    assert await held(store, "n1/1") == [(dst.id, "idle", None)]  # the move took: the instance exists
    assert await held(store, "n1/0") == [(src.id, "idle", None)]
    await clean(store)


CASES = [
    an_exit_from_the_source_during_a_move_drops_the_created_target,
    an_abort_before_the_exit_drops_the_target_and_the_exit_then_frees_the_source,
    an_exit_from_the_target_before_the_commit_leaves_the_target_idle,
]
