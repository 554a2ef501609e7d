"""A reservation that tracks its own place command (``Reservation.track``, ``lua/reserve.lua``), written once against
the store interface: ``tests/contract/test_state_store.py`` runs the scenarios on ``MemoryState`` and on
``RedisState``.

The balancer sends each place command itself, so the reservation records it in the shard's ``:cmds`` in the
same transition: id ``place:<job>:<attempt>``, with the node, the job, the GPU and ``at`` = the reservation's
time (what the node registry's command sweep reads). A reservation that is refused records nothing, and one
without ``track`` records nothing either (the node registry tracks the commands it sends)."""

from __future__ import annotations

from typing import Any

from shared.state import Reservation, audit
from tests.contract.state_cases.expiry import GEO, NOW, P1, gpu, new


def _reservation(job: str, inst: Any, ver: int, track: bool) -> Reservation:
    return Reservation(job_id=job, gpu_id=inst.id.split(":", 1)[0], expected_ver=ver, instance=inst,
                       action="create", max_count=P1.max_count, spec=b"{}", submitted_at=NOW, track=track)


async def a_tracked_reservation_records_its_place_command_for_the_time_out_sweep(store: Any) -> None:
    await store.register_node("n1", [gpu(0)], NOW, "reg-1")
    (g,) = await store.get_gpus(["n1/0"])
    res = await store.reserve(_reservation("j1", new("j1", 0), g.ver, True), NOW + 0.5)
    assert res.ok, res
    assert await store.commands(0) == {
        f"place:j1:{res.detail}": {"node": "n1", "kind": "place", "job": "j1", "gpu": "n1/0", "at": NOW + 0.5}
    }
    # the executor's confirmation forgets it, as for a command the node registry tracked
    assert await store.mark_running("j1", new("j1", 0).id, NOW + 1, f"place:j1:{res.detail}") == "ok"
    assert await store.commands(0) == {}
    assert await audit(store, GEO) == []


async def a_refused_or_untracked_reservation_records_no_command(store: Any) -> None:
    await store.register_node("n1", [gpu(0)], NOW, "reg-1")
    (g,) = await store.get_gpus(["n1/0"])
    stale = await store.reserve(_reservation("j1", new("j1", 0), g.ver + 7, True), NOW)
    assert stale.status == "conflict"
    assert await store.commands(0) == {}
    plain = await store.reserve(_reservation("j2", new("j2", 0, start=1), g.ver, False), NOW)
    assert plain.ok, plain
    assert await store.commands(0) == {}
    # a replayed reservation of a job already placing is a no-op: it records no second command
    again = await store.reserve(_reservation("j2", new("j2", 0, start=1), g.ver, True), NOW)
    assert again.status == "known"
    assert await store.commands(0) == {}


CASES = [
    a_tracked_reservation_records_its_place_command_for_the_time_out_sweep,
    a_refused_or_untracked_reservation_records_no_command,
]
