"""A job settled before it was ever recorded (rejected on arrival: it could never run here), written once against
the store interface: ``tests/contract/test_state_store.py`` runs the scenarios on ``MemoryState`` and on
``RedisState`` (``lua/settle.lua``).

The submit handed in is kept, so that what the job asked stays readable (``migsched status`` and ``describe``);
a job already recorded keeps the spec it was queued with."""

from __future__ import annotations

from typing import Any

from shared.mig.geometry import default_geometry
from shared.state import audit

GEO = default_geometry()
NOW = 1000.0


async def a_job_rejected_on_arrival_keeps_what_it_asked(store: Any) -> None:
    spec = b'{"job_id":"never","demand":{"kind":"mig","profile":"3g"}}'
    assert await store.settle("never", "rejected", "3g needs a GPU in MIG mode; none here is", NOW, ("-",),
                              spec) == "ok"
    (rec,) = await store.jobs(["never"])
    assert rec is not None and (rec.state, rec.spec) == ("rejected", spec)
    assert [h.reason for h in await store.history("never")] == ["3g needs a GPU in MIG mode; none here is"]
    # without a spec (a tombstone), nothing is stored for it
    assert await store.settle("bare", "rejected", "why", NOW, ("-",)) == "ok"
    (bare,) = await store.jobs(["bare"])
    assert bare is not None and bare.spec == b""
    assert await audit(store, GEO) == []


async def a_queued_job_keeps_the_spec_it_was_queued_with(store: Any) -> None:
    await store.enqueue("q", b'{"queued": true}', 0, NOW, "no room", NOW)
    assert await store.settle("q", "rejected", "waited too long", NOW + 1, ("-", "pending"), b'{"other": 1}') == "ok"
    (rec,) = await store.jobs(["q"])
    assert rec is not None and (rec.state, rec.spec) == ("rejected", b'{"queued": true}')
    assert await audit(store, GEO) == []


CASES = [a_job_rejected_on_arrival_keeps_what_it_asked, a_queued_job_keeps_the_spec_it_was_queued_with]
