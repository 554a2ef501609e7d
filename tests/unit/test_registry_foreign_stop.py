"""A registration that finds a job running where the state does not hold it stops that run only: by the time the
stop arrives the job may run on the same node again, placed anew, and that run is not the stop's to end."""

from __future__ import annotations

import pytest

from services.executor.backend import WorkloadSpec
from services.executor.service import Executor, ExecutorSettings
from services.executor.sim_backend import SimBackend
from services.registry.service import NodeRegistry
from shared.bus import MemoryBus
from shared.events import Command, GpuReport, InstanceReport, Registered, now
from shared.mig.geometry import default_geometry
from shared.policy.partition import MigOp
from shared.settings import RegistrySettings, load
from shared.state.memory_store import MemoryState

pytestmark = pytest.mark.unit
P1 = default_geometry().model("A100-40GB").profile("1g.5gb")


class _Delivery:
    ctx = None


def test_the_stop_for_a_foreign_run_names_the_instance_it_was_found_on() -> None:
    st = load(RegistrySettings, env={}, metrics_port=0)
    reg = NodeRegistry(st, MemoryBus(st), MemoryState())
    r = Registered(id="reg-1", node="n1", at=now(), gpus=(GpuReport(index=0, model="A100-40GB", uuid="GPU-0"),))
    out = reg.nodes.stop_foreign(r, "j1", "n1/0", "n1/0:1g.5gb@0:j1", now(), _Delivery())  # type: ignore[arg-type]
    cmd = out.msg
    assert isinstance(cmd, Command) and cmd.kind == "stop"
    assert (cmd.job_id, cmd.instance_id, cmd.src_instance_id) == ("j1", "n1/0:1g.5gb@0:j1", "n1/0:1g.5gb@0:j1")


def test_the_stop_for_a_foreign_run_names_the_command_that_started_it_when_the_node_said_so() -> None:
    st = load(RegistrySettings, env={}, metrics_port=0)
    reg = NodeRegistry(st, MemoryBus(st), MemoryState())
    iid = "n1/0:1g.5gb@0:j1"
    found = InstanceReport(instance_id=iid, profile="1g.5gb", start=0, size=1, job_id="j1", started_by="place:j1:1")
    r = Registered(id="reg-1", node="n1", at=now(),
                   gpus=(GpuReport(index=0, model="A100-40GB", uuid="GPU-0", instances=(found,)),))
    cmd = reg.nodes.stop_foreign(r, "j1", "n1/0", iid, now(), _Delivery()).msg  # type: ignore[arg-type]
    assert isinstance(cmd, Command) and (cmd.src_instance_id, cmd.src_cmd_id) == (iid, "place:j1:1")


async def running(start: int, started_by: str) -> tuple[Executor, str]:
    """An executor of n1 whose job j1 runs on a 1g at ``start`` of GPU 0, started by command ``started_by``."""
    st = load(ExecutorSettings, env={}, node="n1", metrics_port=0)
    ex = Executor(MemoryBus(st), SimBackend(node="n1", models=["A100-40GB"], reconfig_latency_s=0.0), st, "n1")
    info = await ex.backend.create_instance(0, P1.profile_id, start)
    await ex.backend.start_workload("j1", info, WorkloadSpec(duration_s=60.0))
    iid = f"n1/0:1g.5gb@{start}:j1"
    ex.book._remember(iid, info)  # what the place command that created it records
    ex.runs.started_by["j1"] = started_by
    return ex, iid


def stop(iid: str, of: str | None = None) -> Command:
    return Command(id=f"stop:j1:{of}", cmd_id=f"stop:j1:{of}", kind="stop", node="n1", gpu_id="n1/0", gpu_index=0,
                   job_id="j1", instance_id=iid, src_instance_id=iid, src_cmd_id=of, at=now())


async def test_the_executor_leaves_a_newer_run_of_the_job_alone() -> None:
    ex, _ = await running(1, "place:j1:2")
    await ex.apply(stop("n1/0:1g.5gb@0:j1"), None)  # type: ignore[arg-type]  # the run found on 1g@0
    assert "j1" in ex.backend.running()  # its current run, on 1g@1, goes on
    await ex.backend.close()


async def test_a_stop_of_a_late_commands_run_leaves_a_later_placement_on_an_instance_of_the_same_id() -> None:
    ex, iid = await running(2, "place:j1:4")  # the late run's instance, reused by the job's newest placement
    await ex.apply(stop(iid, "place:j1:1"), None)  # type: ignore[arg-type]
    assert "j1" in ex.backend.running()
    await ex.apply(stop(iid, "place:j1:4"), None)  # type: ignore[arg-type]
    assert "j1" not in ex.backend.running()
    await ex.backend.close()


async def test_a_late_place_for_the_instance_the_job_already_runs_on_does_not_claim_that_run() -> None:
    st = load(ExecutorSettings, env={}, node="n1", metrics_port=0)
    ex = Executor(MemoryBus(st), SimBackend(node="n1", models=["A100-40GB"], reconfig_latency_s=0.0), st, "n1")
    iid = "n1/0:1g.5gb@0:j1"
    ops = tuple(MigOp(kind=k, gpu_id="n1/0", instance_id=iid, profile=P1.name, profile_id=P1.profile_id, start=0,
                      size=P1.memory_slices) for k in ("create_gi", "create_ci"))

    def place(cid: str) -> Command:
        return Command(id=cid, cmd_id=cid, kind="place", node="n1", gpu_id="n1/0", gpu_index=0, ops=ops,
                       instance_id=iid, job_id="j1", at=now(), submitted_at=now(), duration_s=60.0)

    await ex.apply(place("place:j1:2"), None)  # type: ignore[arg-type]  # the job's current placement
    await ex.apply(place("place:j1:1"), None)  # type: ignore[arg-type]  # an earlier one, applied late
    assert ex.runs.started_by["j1"] == "place:j1:2"
    await ex.apply(stop(iid, "place:j1:1"), None)  # type: ignore[arg-type]  # the registry stops the late run
    assert "j1" in ex.backend.running()  # which never started: the current run goes on
    await ex.backend.close()
