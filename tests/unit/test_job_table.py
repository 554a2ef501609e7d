"""The job table's indexes: ``running()`` (a live view of job -> instance) and ``job_on`` / ``jobs_on`` (instance
-> job) answer without a pass over the runs, and always as a scan of the runs in their order would."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.executor.backend import InstanceInfo, WorkloadError, WorkloadSpec
from services.executor.sim_backend import SimBackend
from services.executor.workload import JobTable, Run, RunResult

pytestmark = pytest.mark.unit

GPUS, GIS = 3, 3


def inst(gpu: int, gi: int) -> InstanceInfo:
    return InstanceInfo(gpu_index=gpu, gi_id=gi, ci_id=0, profile_id=19, profile="1g.5gb", start=gi, size=1)


class StubRun(Run):
    """A run that ends when told (``end``) or stopped, with no task of its own."""

    async def stop(self, grace_s: float) -> None:
        if self.done.done():
            return
        self.stopped = True
        self._finish(RunResult(status=-15))

    def end(self, status: int = 0) -> None:
        self._finish(RunResult(status=status))


def scan(table: JobTable, gpu: int, gi: int) -> str | None:
    """What ``job_on`` answered before it had an index: the first run on the instance, in the table's order."""
    for job, run in table.runs().items():
        if (run.instance.gpu_index, run.instance.gi_id) == (gpu, gi):
            return job
    return None


def assert_agrees_with_a_scan(table: JobTable, views: Mapping[int, Mapping[int, str]],
                              running: Mapping[str, InstanceInfo]) -> None:
    runs = table.runs()
    expected = {job: run.instance for job, run in runs.items()}
    assert list(table.running().items()) == list(expected.items())  # same jobs, same order
    assert list(running.items()) == list(expected.items())  # a view taken earlier is live
    for gpu in range(GPUS + 1):
        on_gpu = {gi: job for gi in range(GIS + 1) if (job := scan(table, gpu, gi)) is not None}
        for gi in range(GIS + 1):
            assert table.job_on(gpu, gi) == on_gpu.get(gi), (gpu, gi)
        assert dict(table.jobs_on(gpu)) == on_gpu
        if gpu in views:
            assert dict(views[gpu]) == on_gpu  # a GPU's view taken earlier is live too


async def settle() -> None:
    for _ in range(5):  # the watcher of a run that ended: scheduled, then woken through the shield
        await asyncio.sleep(0)


@pytest.fixture
async def table() -> AsyncIterator[JobTable]:
    made = JobTable()
    yield made
    await made.close()


async def test_a_started_job_is_found_on_its_instance_and_in_running(table: JobTable) -> None:
    table.add("a", StubRun(inst(0, 1)))
    table.add("b", StubRun(inst(1, 1)))
    assert table.job_on(0, 1) == "a" and table.job_on(1, 1) == "b" and table.job_on(0, 2) is None
    assert dict(table.running()) == {"a": inst(0, 1), "b": inst(1, 1)}
    assert dict(table.jobs_on(0)) == {1: "a"} and dict(table.jobs_on(2)) == {}
    assert table.check_can_start("a", inst(0, 1)) is True  # a replayed start
    with pytest.raises(WorkloadError, match="busy with job b"):
        table.check_can_start("c", inst(1, 1))


async def test_running_is_a_read_only_view_that_follows_starts_and_ends(table: JobTable) -> None:
    view = table.running()
    table.add("a", StubRun(inst(0, 1)))
    assert "a" in view
    with pytest.raises(TypeError):
        view["b"] = inst(0, 2)  # type: ignore[index]
    await table.stop("a", 0.0)
    assert "a" not in view and table.job_on(0, 1) is None
    assert (await table.next_exit()).reason == "stopped"


async def test_a_job_that_ends_on_its_own_leaves_the_index_once_its_exit_is_queued(table: JobTable) -> None:
    run = StubRun(inst(2, 3))
    table.add("a", run)
    run.end(1)
    exit_ = await asyncio.wait_for(table.next_exit(), 1.0)
    assert (exit_.job_id, exit_.reason) == ("a", "failed")
    assert table.job_on(2, 3) is None and "a" not in table.running() and dict(table.jobs_on(2)) == {}


async def test_a_moved_job_is_found_on_its_target_only_and_its_source_instance_is_free(table: JobTable) -> None:
    table.add("before", StubRun(inst(0, 2)))
    table.add("a", StubRun(inst(0, 1)))
    table.add("after", StubRun(inst(1, 2)))

    async def target() -> Run:
        return StubRun(inst(1, 1))

    await table.move("a", target, confirm_s=0.0, grace_s=0.0)
    assert table.job_on(1, 1) == "a" and table.job_on(0, 1) is None
    assert list(table.running()) == ["before", "a", "after"]  # the job keeps its place, as it did
    await settle()
    assert table.exits_ready(10) == []  # the retired source is no exit
    assert_agrees_with_a_scan(table, {}, table.running())


async def test_close_empties_the_table_and_the_views_handed_out_before() -> None:
    table = JobTable()
    running, on_gpu = table.running(), table.jobs_on(0)
    table.add("a", StubRun(inst(0, 1)))
    await table.close()
    assert dict(running) == {} and dict(on_gpu) == {} and table.job_on(0, 1) is None
    table.add("b", StubRun(inst(0, 1)))  # usable again
    assert dict(on_gpu) == {1: "b"} and table.job_on(0, 1) == "b"
    await table.close()


async def test_two_jobs_adopted_onto_one_instance_answer_as_a_scan_does_first_come_first(table: JobTable) -> None:
    first, second = StubRun(inst(0, 1)), StubRun(inst(0, 1))
    table.add("x", first)
    table.add("y", second)  # an adoption (no check_can_start): a state file listing both
    assert table.job_on(0, 1) == "x"
    first.end()
    await asyncio.wait_for(table.next_exit(), 1.0)
    assert table.job_on(0, 1) == "y"
    await table.stop("y", 0.0)
    assert table.job_on(0, 1) is None and dict(table.jobs_on(0)) == {}


async def test_adding_a_job_again_replaces_its_run_in_place_and_in_the_index(table: JobTable) -> None:
    table.add("a", StubRun(inst(0, 1)))
    table.add("b", StubRun(inst(0, 2)))
    table.add("a", StubRun(inst(1, 1)))
    assert list(table.running()) == ["a", "b"]
    assert table.job_on(0, 1) is None and table.job_on(1, 1) == "a"


# --- any sequence of operations -------------------------------------------------------------------------------

JOBS = ("a", "b", "c", "d", "e")
slots = st.tuples(st.integers(0, GPUS - 1), st.integers(0, GIS - 1))
ops = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(JOBS), slots),
    st.tuples(st.just("start"), st.sampled_from(JOBS), slots),
    st.tuples(st.just("move"), st.sampled_from(JOBS), slots),
    st.tuples(st.just("end"), st.sampled_from(JOBS), slots),
    st.tuples(st.just("stop"), st.sampled_from(JOBS), slots),
    st.tuples(st.just("close"), st.sampled_from(JOBS), slots),
)


async def play(plan: list[tuple[str, str, tuple[int, int]]]) -> None:
    table = JobTable()
    running = table.running()
    views = {gpu: table.jobs_on(gpu) for gpu in range(GPUS)}  # empty now: not yet any run on the GPU
    for op, job, (gpu, gi) in plan:
        current = table.get(job)
        if op == "add":  # as an adoption does: no check (two runs on one instance possible)
            table.add(job, StubRun(inst(gpu, gi)))
        elif op == "start":  # as a backend does
            try:
                if not table.check_can_start(job, inst(gpu, gi)):
                    table.add(job, StubRun(inst(gpu, gi)))
            except WorkloadError:
                pass
        elif op == "move" and current is not None:

            async def target(gpu: int = gpu, gi: int = gi) -> Run:
                return StubRun(inst(gpu, gi))

            await table.move(job, target, confirm_s=0.0, grace_s=0.0)
        elif op == "end" and isinstance(current, StubRun):
            current.end()
        elif op == "stop":
            await table.stop(job, 0.0)
        elif op == "close":
            await table.close()
        await settle()
        table.exits_ready(100)
        assert_agrees_with_a_scan(table, views, running)
    await table.close()
    assert_agrees_with_a_scan(table, views, running)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=st.lists(ops, max_size=40))
def test_after_any_sequence_of_starts_moves_ends_stops_and_closes_the_index_agrees_with_a_scan(
    plan: list[tuple[str, str, tuple[int, int]]],
) -> None:
    asyncio.run(play(plan))


# --- the sim backend's listing, sorted once per change of a GPU ------------------------------------------------


async def test_the_sim_backends_listing_follows_every_create_and_destroy_and_is_the_callers_to_keep() -> None:
    sim = SimBackend(node="n1", models=["A100-40GB"] * 2, reconfig_latency_s=0.0)
    late = await sim.create_instance(0, 19, 6)
    early = await sim.create_instance(0, 19, 0)
    listed = await sim.list_instances(0)
    assert [(i.start, i.gi_id) for i in listed] == [(0, early.gi_id), (6, late.gi_id)]
    assert isinstance(listed, list)
    listed.clear()  # a caller's own list: the next listing is whole
    assert await sim.list_instances(0) == [early, late] and await sim.list_instances(1) == []
    await sim.destroy_instance(0, early.gi_id)
    assert await sim.list_instances(0) == [late]
    again = await sim.create_instance(0, 19, 0)  # the lowest free GI id again
    assert again.gi_id == early.gi_id and await sim.list_instances(0) == [again, late]
    whole = await sim.create_instance(1, 0, 0)  # 7g.40gb: GI 0
    assert whole.gi_id == 0 and await sim.list_instances(1) == [whole]
    await sim.start_workload("j", again, WorkloadSpec())
    assert dict(sim.jobs_on(0)) == {again.gi_id: "j"} and sim.running()["j"] == again
    await sim.close()
