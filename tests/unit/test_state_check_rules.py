"""The state audit (``shared.state.check``): each rule, broken once, is reported with its kind and subject, and
a consistent state is reported clean."""

from __future__ import annotations

import pytest

from shared.mig.geometry import default_geometry
from shared.state import JobRecord, StoredGpu, StoredInstance
from shared.state.check import check_state

pytestmark = pytest.mark.unit
GEO = default_geometry()


def _inst(iid: str, profile: str, start: int, size: int, job: str | None = None) -> StoredInstance:
    return StoredInstance(id=iid, profile=profile, start=start, size=size, compute=size,
                          state="busy" if job else "idle", job=job)


def _gpu(*insts: StoredInstance, gid: str = "n1/0", model: str = "A100-40GB", pos: int = 0) -> StoredGpu:
    return StoredGpu(id=gid, node=gid.split("/")[0], index=int(gid.split("/")[1]), model=model, mig=True,
                     pos=pos, instances=list(insts))


def _running(job: str, gpu: str, inst: str, **kw: object) -> JobRecord:
    return JobRecord(job_id=job, state="running", gpu=gpu, inst=inst, **kw)  # type: ignore[arg-type]


def _found(gpus: list[StoredGpu], jobs: list[JobRecord], pending: set[str] | None = None,
           occupancy: bytes | None = None) -> list[tuple[str, str]]:
    return [(v.kind, v.subject) for v in check_state(GEO, gpus, jobs, pending or set(), occupancy)]


def test_a_consistent_state_of_mig_instances_jobs_and_queue_is_clean() -> None:
    g = _gpu(_inst("a", "3g.20gb", 0, 4, "j1"), _inst("b", "3g.20gb", 4, 4))
    jobs = [_running("j1", "n1/0", "a"), JobRecord(job_id="j2", state="pending")]
    assert check_state(GEO, [g], jobs, {"j2"}, bytes([g.busy_mask])) == []


def test_a_gpu_of_an_unknown_model_is_reported_and_its_instances_are_not_judged() -> None:
    g = _gpu(_inst("a", "9g.99gb", 3, 4), model="Z100")
    assert _found([g], []) == [("model", "n1/0")]


def test_overlapping_instances_an_unknown_profile_and_an_illegal_start_are_each_reported() -> None:
    overlap = _gpu(_inst("a", "4g.20gb", 0, 4), _inst("b", "2g.10gb", 2, 2), gid="n1/0")
    profile = _gpu(_inst("c", "5g.25gb", 0, 5), gid="n1/1")
    start = _gpu(_inst("d", "3g.20gb", 2, 4), gid="n1/2")
    assert _found([overlap, profile, start], []) == [
        ("overlap", "n1/0"), ("profile", "n1/1"), ("placement", "n1/2"),
    ]


def test_more_instances_of_a_profile_than_its_max_count_are_reported() -> None:
    g = _gpu(_inst("a", "1g.5gb+me", 0, 1), _inst("b", "1g.5gb+me", 1, 1))
    assert _found([g], []) == [("count", "n1/0")]


def test_an_occupancy_byte_that_differs_from_the_busy_mask_is_reported() -> None:
    g = _gpu(_inst("a", "3g.20gb", 0, 4, "j1"))
    jobs = [_running("j1", "n1/0", "a")]
    assert _found([g], jobs, occupancy=bytes([0])) == [("occupancy", "n1/0")]
    assert _found([g], jobs, occupancy=bytes([g.busy_mask])) == []


def test_a_job_in_no_known_state_or_out_of_step_with_the_queue_is_reported() -> None:
    jobs = [JobRecord(job_id="odd", state="sleeping"), JobRecord(job_id="lost", state="pending"),
            JobRecord(job_id="late", state="finished")]
    assert _found([], jobs, {"late", "ghost"}) == [
        ("state", "odd"), ("queue", "lost"), ("queue", "late"), ("queue", "ghost"),
    ]


def test_an_active_job_whose_instance_does_not_hold_it_and_an_instance_held_for_another_are_reported() -> None:
    g = _gpu(_inst("a", "3g.20gb", 0, 4, "j2"), _inst("b", "3g.20gb", 4, 4))
    jobs = [_running("j1", "n1/0", "b"), _running("j2", "n1/0", "elsewhere")]
    assert sorted(_found([g], jobs)) == [("orphan", "n1/0"), ("reservation", "j1"), ("reservation", "j2")]


def test_a_gang_whose_first_slot_is_not_the_job_s_instance_is_reported() -> None:
    a, b = _gpu(_inst("a", "7g.40gb", 0, 8, "g"), gid="n1/0"), _gpu(_inst("b", "7g.40gb", 0, 8, "g"), gid="n1/1")
    ok = _running("g", "n1/0", "a", slots=(("n1/0", "a"), ("n1/1", "b")))
    assert _found([a, b], [ok]) == []
    swapped = _running("g", "n1/0", "a", slots=(("n1/1", "b"), ("n1/0", "a")))
    assert _found([a, b], [swapped]) == [("reservation", "g")]


def test_a_moving_job_names_its_target_too() -> None:
    g = _gpu(_inst("a", "3g.20gb", 0, 4, "j"), _inst("t", "3g.20gb", 4, 4, "j"))
    moving = JobRecord(job_id="j", state="migrating", gpu="n1/0", inst="a", mig_gpu="n1/0", mig_inst="t")
    assert _found([g], [moving]) == []
    assert _found([g], [_running("j", "n1/0", "a")]) == [("orphan", "n1/0")]
