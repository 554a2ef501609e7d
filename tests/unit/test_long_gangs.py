"""A gang that would hold a large share of the cluster for hours waits for headroom (or its turn), gets no
reservation while it waits, and is placed the same by the policy, its index and the simulator."""

from __future__ import annotations

import re

import pytest

from shared.mig.geometry import default_geometry
from shared.policy.placement.align_index import AlignIndex
from shared.policy.placement.alignment import AlignParams
from shared.policy.placement.decision import CannotPlace, JobRequest, Placement
from shared.policy.placement.long_gangs import is_long, waits
from shared.policy.placement.plugins.migsched import place_aligned
from shared.policy.placement.registry import UnknownPolicyError, get_policy
from shared.policy.request import Demand, mig
from shared.policy.snapshot import GpuView, InstanceView, snapshot_of
from shared.sim import reserving
from shared.sim.cluster import parse_cluster
from shared.sim.config import InterferenceParams, SimConfig
from shared.sim.engine import Simulator
from shared.sim.jobs import SimJob, Workload

pytestmark = pytest.mark.unit
GEO = default_geometry()
P = AlignParams()  # long: more than 4 h of every GPU; keeps half the GPUs empty; or after 7,200 s
HOUR = 3600.0


def test_a_gang_is_long_when_its_gpu_time_exceeds_the_share_of_the_cluster() -> None:
    assert not is_long(P, 4, 7.9 * HOUR, 8)  # 31.6 GPU-h against 32
    assert is_long(P, 4, 8.1 * HOUR, 8)
    assert not is_long(P, 1, 1000 * HOUR, 8)  # one GPU is no gang
    assert not is_long(P, 4, None, 8)  # nothing known of its length
    assert not is_long(AlignParams(gang_hours=0), 4, 1000 * HOUR, 8)  # the rule off


def test_a_long_gang_waits_while_it_would_leave_less_than_the_room_empty() -> None:
    why = waits(P, 4, 100 * HOUR, 0.0, 7, 8)  # 3 left empty, 4 kept
    assert why is not None and "waits until 4 GPU(s) stay empty" in why and "(7 empty now)" in why
    assert waits(P, 4, 100 * HOUR, 0.0, 8, 8) is None  # 4 left: room enough
    assert waits(P, 4, 100 * HOUR, None, 7, 8) is not None  # waited: unknown


def test_a_long_gang_that_has_waited_its_turn_is_placed_as_any_gang() -> None:
    assert waits(P, 4, 100 * HOUR, 7199.0, 4, 8) is not None
    assert waits(P, 4, 100 * HOUR, 7200.0, 4, 8) is None


def _cluster(busy: int) -> list[GpuView]:
    """Two nodes of four A100s; the first ``busy`` GPUs (node n1 first) each run a 1g job for 10 h."""
    gpus = []
    for i in range(8):
        node, index = f"n{1 + i // 4}", i % 4
        insts = ([InstanceView(id=f"g{i}/x", profile="1g.5gb", start=0, size=1, compute=1, job_id=f"x{i}",
                               ends_at=10 * HOUR)] if i < busy else [])
        gpus.append(GpuView.build(id=f"g{i}", node=node, index=index, model="A100-40GB", instances=insts))
    return gpus


def _gang(hint_s: float, waited_s: float) -> JobRequest:
    return JobRequest(job_id="gang", demand=Demand(kind="gpus", gpus=4), duration_hint_s=hint_s, now=HOUR,
                      submitted_at=HOUR - waited_s)


@pytest.mark.parametrize(("hint_h", "waited_s", "busy", "placed"), [
    (100.0, 0.0, 2, False),  # long, would leave 2 GPUs of 8 empty
    (100.0, 0.0, 0, True),  # long, leaves 4 empty: room enough
    (100.0, 7200.0, 3, True),  # long, but it has waited its turn
    (2.0, 0.0, 3, True),  # short: placed wherever it fits
])
def test_the_policy_and_its_index_keep_a_long_gang_waiting_alike(
    hint_h: float, waited_s: float, busy: int, placed: bool,
) -> None:
    gpus = _cluster(busy)
    job = _gang(hint_h * HOUR, waited_s)
    decision = place_aligned(snapshot_of(GEO, gpus), job)
    index = AlignIndex(GEO, gpus, AlignParams())
    assert isinstance(decision, Placement) == placed
    assert index.decide(job, "migsched") == (decision if placed else None)
    assert index.place(job.demand, job.duration_hint_s, job.now, job.submitted_at) == (
        decision.slots if isinstance(decision, Placement) else None)
    if not placed:
        assert isinstance(decision, CannotPlace) and decision.deferred
        assert index.waits(4, job.duration_hint_s, waited_s) == decision.reasons[-1]


def test_a_gang_that_does_not_fit_is_not_deferred_but_waits_for_room() -> None:
    decision = place_aligned(snapshot_of(GEO, _cluster(8)), _gang(2.0 * HOUR, 0.0))
    assert isinstance(decision, CannotPlace) and not decision.deferred


def _workload() -> Workload:
    """Two nodes of four GPUs. Three 7g jobs of 3 h from t=0; a 4-GPU gang of 50 h at t=60 (long: 200 GPU-h
    against 32), patient for 3 h; a 1g job at t=7,300, after the gang has waited its 7,200 s."""
    jobs = [SimJob(id=f"s{k}", arrival=float(k), duration=3 * HOUR, demand=mig("7g"), shape="7g")
            for k in range(3)]
    jobs.append(SimJob(id="gang", arrival=60.0, duration=50 * HOUR, demand=Demand(kind="gpus", gpus=4),
                       shape="7g", patience=3 * HOUR))
    jobs.append(SimJob(id="late", arrival=7300.0, duration=60.0, demand=mig("1g"), shape="1g"))
    return Workload(name="long-gang", jobs=tuple(jobs))


def _run(monkeypatch: pytest.MonkeyPatch, **params: float) -> tuple[Simulator, int, list[str]]:
    held: list[str] = []
    original = reserving.schedule

    def recording(sim: Simulator) -> None:
        original(sim)
        held.extend(r.job_id for r in sim.reservations)

    monkeypatch.setattr(reserving, "schedule", recording)
    spec, pol = get_policy("migsched", **params)
    cfg = SimConfig(check_invariants=True, interference=InterferenceParams(beta=0.0))
    wl = _workload()
    sim = Simulator(wl, parse_cluster(["A100-40GB:8"], GEO, 4), spec, pol, cfg)
    sim.run()
    return sim, next(i for i, j in enumerate(wl.jobs) if j.id == "gang"), held


def test_the_simulator_holds_nothing_for_a_long_gang_kept_waiting_and_starts_it_in_its_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim, gang, held = _run(monkeypatch)
    # three 7g jobs leave 5 GPUs empty and the gang would leave 1 of the 4 it must: it waits, with no hold,
    # until the first pass after it has waited 7,200 s (the 1g job's arrival)
    assert "gang" not in held
    assert sim.out.completed[gang] and sim.out.start[gang] == pytest.approx(7300.0, abs=1.0)
    off, gang_off, _ = _run(monkeypatch, gang_hours=0.0)
    assert off.out.start[gang_off] == pytest.approx(60.0, abs=1.0)  # the rule off: at once, on the empty node


@pytest.mark.parametrize(("params", "why"), [
    ({"gang_room": "abc"}, "Expected `float`, got `str` - at `$.gang_room`"),
    ({"gang_room": 1.5}, "Expected `float` <= 1.0 - at `$.gang_room`"),
    ({"gang_hours": -1.0}, "Expected `float` >= 0.0 - at `$.gang_hours`"),
    ({"fit_steps": -1.0}, "Expected `float` >= 0.0 - at `$.fit_steps`"),
])
def test_a_policy_parameter_of_the_wrong_type_or_out_of_bounds_is_refused_with_the_reason(
    params: dict[str, object], why: str,
) -> None:
    with pytest.raises(UnknownPolicyError, match=re.escape(f"policy 'migsched': {why}")):
        get_policy("migsched", **params)
