"""The sim backend: deterministic identities, fault knobs, time scaling, and agreement with the NVML path."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import pynvml
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.executor import sim_backend
from services.executor.backend import (
    BackendError,
    InstanceInfo,
    InsufficientResourcesError,
    PermissionDeniedError,
    WorkloadSpec,
)
from services.executor.backends import make_backend
from services.executor.nvml_backend import NvmlBackend
from services.executor.nvml_fake import FakeGpu, FakeNvml
from services.executor.process import ProcessRun, proc_start_time
from services.executor.sim_backend import SimBackend
from shared.mig.geometry import default_geometry

pytestmark = pytest.mark.unit


async def test_gpu_and_mig_uuids_are_deterministic_per_node_and_distinct() -> None:
    a = SimBackend(node="n1", models=["A100-40GB"] * 2, reconfig_latency_s=0)
    b = SimBackend(node="n1", models=["A100-40GB"] * 2, reconfig_latency_s=0)
    c = SimBackend(node="n2", models=["A100-40GB"] * 2, reconfig_latency_s=0)
    assert [g.uuid for g in await a.discover()] == [g.uuid for g in await b.discover()]
    assert {g.uuid for g in await a.discover()}.isdisjoint(g.uuid for g in await c.discover())
    ia, ib = await a.create_instance(0, 9, 4), await b.create_instance(0, 9, 4)
    assert ia.uuid == ib.uuid and ia.uuid.startswith("MIG-")
    again = await a.create_instance(0, 9, 0)
    assert again.uuid != ia.uuid


async def test_a_queued_fault_fails_the_next_operation_with_its_typed_error_once() -> None:
    sim = SimBackend(node="n1", models=["A30-24GB"], reconfig_latency_s=0)
    sim.fail_next("create", pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(PermissionDeniedError):
        await sim.create_instance(0, 0, 0)
    inst = await sim.create_instance(0, 0, 0)  # A30 4g.24gb is profile ID 0
    sim.fail_next("destroy", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(BackendError) as err:
        await sim.destroy_instance(0, inst.gi_id)
    assert err.value.code == pynvml.NVML_ERROR_UNKNOWN
    await sim.destroy_instance(0, inst.gi_id)


async def test_speedup_divides_the_simulated_run_time(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float | None] = []

    class Recorder(sim_backend.SleepRun):
        def __init__(self, instance: object, duration_s: float | None) -> None:
            seen.append(duration_s)
            super().__init__(instance, 0.0)  # type: ignore[arg-type]

    monkeypatch.setattr(sim_backend, "SleepRun", Recorder)
    sim = make_backend("sim", node="n1", models=["A100-40GB"], reconfig_latency_s=0, speedup=100.0)
    inst = await sim.create_instance(0, 0, 0)
    await sim.start_workload("j", inst, WorkloadSpec(duration_s=30.0))
    assert (await asyncio.wait_for(sim.next_exit(), 5)).reason == "completed"
    assert seen == [pytest.approx(0.3)]
    await sim.close()


async def test_a_stopped_job_has_left_running_when_stop_returns_and_exits_once() -> None:
    # a registration right after a stop (the resync path) must not report the stopped job
    sim = SimBackend(node="n1", models=["A100-40GB"], reconfig_latency_s=0)
    inst = await sim.create_instance(0, 0, 0)
    await sim.start_workload("j", inst, WorkloadSpec(duration_s=None))
    await sim.stop_workload("j")
    assert "j" not in sim.running()
    ex = await asyncio.wait_for(sim.next_exit(), 5)
    assert (ex.job_id, ex.reason) == ("j", "stopped")
    await asyncio.sleep(0)  # the run's watcher gets its turn: no second exit
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(sim.next_exit(), 0.05)
    await sim.close()


async def test_a_simulated_node_that_goes_away_takes_its_process_workloads_with_it(tmp_path: Path) -> None:
    # no later sim executor adopts them (the nvml backend does): left running they would run twice
    sim = SimBackend(node="n1", models=["A100-40GB"], mig_disabled=[0], workloads="process", log_dir=tmp_path)
    binding = InstanceInfo(gpu_index=0, gi_id=2048, ci_id=None, profile_id=0, profile="gpu", start=0, size=0,
                           uuid="", gpus=(0,))
    await sim.start_workload("j", binding, WorkloadSpec(argv=(sys.executable, "-c", "import time; time.sleep(60)")))
    run = sim._jobs.get("j")
    assert isinstance(run, ProcessRun) and proc_start_time(run.pid) is not None
    await sim.close()
    assert proc_start_time(run.pid) is None


def test_an_unknown_backend_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="sim, nvml"):
        make_backend("cuda", node="n1", models=[])


# Each step: (op, profile name, start) on an A100-40GB; "destroy" removes the instance at that start if any.
A100 = default_geometry().model("A100-40GB")
steps = st.lists(
    st.tuples(
        st.sampled_from(["create", "create", "destroy"]),
        st.sampled_from([p.name for p in A100.profiles]),
        st.integers(0, 7),
    ),
    min_size=1,
    max_size=12,
)


async def _replay(backend: object, plan: list[tuple[str, str, int]]) -> list[object]:
    outcomes: list[object] = []
    for op, name, start in plan:
        listed = {i.start: i for i in await backend.list_instances(0)}  # type: ignore[attr-defined]
        if op == "destroy":
            if start in listed:
                await backend.destroy_instance(0, listed[start].gi_id)  # type: ignore[attr-defined]
            outcomes.append(("destroy", start in listed))
            continue
        try:
            inst = await backend.create_instance(0, A100.profile(name).profile_id, start)  # type: ignore[attr-defined]
            outcomes.append(("ok", inst.profile, inst.start, inst.size))
        except InsufficientResourcesError:
            outcomes.append("conflict")
        except BackendError as exc:
            outcomes.append(("error", exc.code))
    final = [(i.profile, i.start, i.size) for i in await backend.list_instances(0)]  # type: ignore[attr-defined]
    return [*outcomes, final]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=steps)
def test_the_sim_backend_and_the_nvml_backend_over_the_fake_agree_on_every_operation(
    plan: list[tuple[str, str, int]],
) -> None:
    async def both() -> tuple[list[object], list[object]]:
        sim = SimBackend(node="n1", models=["A100-40GB"], reconfig_latency_s=0)
        with tempfile.TemporaryDirectory() as state:
            nv = NvmlBackend(node="n1", nvml=FakeNvml([FakeGpu("A100-40GB")]), state_dir=state)
            try:
                return await _replay(sim, plan), await _replay(nv, plan)
            finally:
                await nv.close()
                await sim.close()

    sim_out, nvml_out = asyncio.run(both())
    assert sim_out == nvml_out
