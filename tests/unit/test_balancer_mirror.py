"""The balancer's mirror: decisions over its column views see every reservation applied before them."""

from __future__ import annotations

from services.balancer.mirror import Mirror, reservation_instance
from shared.mig.geometry import default_geometry
from shared.policy.placement.balancer import place
from shared.policy.placement.decision import CannotPlace, JobRequest, Placement
from shared.policy.request import Demand
from shared.state import StoredGpu

MODEL = "A100-SXM4-40GB"


def test_each_decision_over_the_view_sees_the_reservations_applied_before_it() -> None:
    mirror = Mirror(default_geometry())
    for i in range(2):
        mirror.put(StoredGpu(id=f"n1/{i}", node="n1", index=i, model=MODEL, ver=5))
    placed: list[tuple[str, int]] = []
    for n in range(3):
        view = mirror.view()
        assert mirror.view() is view  # unchanged mirror: the same view, built once
        dec = place(view, JobRequest(job_id=f"j{n}", demand=Demand(kind="mig", profile="7g.40gb")))
        if n == 2:  # both GPUs are taken by then: a stale view would place it again
            assert isinstance(dec, CannotPlace)
            break
        assert isinstance(dec, Placement)
        inst = reservation_instance(dec.slot, f"j{n}", 0, "default", False, True)
        placed.append((dec.slot.gpu_id, mirror.apply(dec.slot, f"j{n}", inst)))
    assert sorted(placed) == [("n1/0", 5), ("n1/1", 5)]
    assert mirror.vers == {"n1/0": 6, "n1/1": 6}
