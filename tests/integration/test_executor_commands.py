"""The executor against a real NATS (JetStream): registration, heartbeats (what runs, where, started by which
command), commands applied idempotently through the sim backend, failures reported with their NVML code, job
exits, stops and gangs (moves: ``test_executor_moves.py``).

Each test runs one in-process executor in its own namespace (``tests.executor_bus_rig``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pynvml
import pytest
from prometheus_client import REGISTRY

from shared.events import (
    CmdDone,
    CmdFailed,
    Command,
    Heartbeat,
    JobExited,
    JobStarted,
    Registered,
    now,
)
from tests.executor_bus_rig import NODE, Rig, create_ops, destroy_ops, is_done, place, started

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


@pytest.fixture
async def rig(nats_url: str, prefix: str) -> AsyncIterator[Rig]:
    async with started(nats_url, prefix) as r:
        yield r


async def test_an_executor_registers_its_gpus_and_heartbeats_what_runs_where(rig: Rig) -> None:
    reg = await rig.watch.until(lambda m: isinstance(m, Registered))
    assert [(g.index, g.model, g.instances) for g in reg.gpus] == [(0, "A100-40GB", ()), (1, "A100-40GB", ())]
    assert reg.backend == "sim"
    await rig.watch.until(lambda m: isinstance(m, Heartbeat) and m.seq >= 2)
    seqs = [h.seq for h in rig.watch.of(Heartbeat)]
    assert seqs == sorted(seqs)
    await rig.send(place("c1", "j1", 1, "3g.20gb", 4, duration=60.0))
    hb = await rig.watch.until(lambda m: isinstance(m, Heartbeat) and "j1" in m.running)
    assert [(s.job_id, s.gpu_index, s.profile, s.start) for s in hb.slots] == [("j1", 1, "3g.20gb", 4)]
    assert [(r.job_id, r.cmd_id) for r in hb.started] == [("j1", "c1")]  # which command started the run


async def test_a_place_command_creates_the_instance_starts_the_job_and_reports_its_exit(rig: Rig) -> None:
    await rig.send(place("c1", "j1", 0, "3g.20gb", 4, duration=0.3))
    done = await rig.watch.until(is_done("c1"))
    assert isinstance(done, CmdDone) and done.instance is not None
    assert (done.instance.profile, done.instance.start, done.instance.size) == ("3g.20gb", 4, 4)
    assert done.instance.instance_id == "n1/0:3g.20gb@4:j1" and done.instance.uuid.startswith("MIG-")
    exited = await rig.watch.until(lambda m: isinstance(m, JobExited) and m.job_id == "j1")
    assert exited.exit == "completed" and exited.status == 0
    # the place's cmd_done is the start report: no job_started any more, and the exit never overtakes it
    order = [type(m) for m in rig.watch.seen if getattr(m, "job_id", None) == "j1"]
    assert JobStarted not in order and order.index(CmdDone) < order.index(JobExited)
    # the instance stays (idle, for reuse) until the node registry says otherwise
    assert [(i.profile, i.start) for i in await rig.executor.backend.list_instances(0)] == [("3g.20gb", 4)]


async def test_the_heartbeats_after_a_job_exit_repeat_its_report(rig: Rig) -> None:
    await rig.send(place("c1", "j1", 0, "1g.5gb", 0, duration=0.0))
    exited = await rig.watch.until(lambda m: isinstance(m, JobExited) and m.job_id == "j1")
    hb = await rig.watch.until(lambda m: isinstance(m, Heartbeat) and m.exits)
    assert [e.report(NODE) for e in hb.exits] == [exited]


async def test_a_job_that_ends_at_once_is_reported_after_its_cmd_done(rig: Rig) -> None:
    await rig.send(place("c0", "j0", 1, "1g.5gb", 0, duration=0.0))
    await rig.watch.until(lambda m: isinstance(m, JobExited) and m.job_id == "j0")
    order = [type(m) for m in rig.watch.seen if getattr(m, "job_id", None) == "j0"]
    assert order == [CmdDone, JobExited]


async def test_a_replayed_place_command_creates_nothing_twice(rig: Rig) -> None:
    cmd = place("c2", "j2", 1, "2g.10gb", 2)
    await rig.send(cmd)
    await rig.watch.until(is_done("c2"))
    await rig.send(cmd, msg_id="c2-redelivered")  # same command, new message: past the stream's dedupe
    await rig.handled(2)
    await rig.restart()  # and once more to a fresh executor process that remembers no command
    await rig.send(cmd, msg_id="c2-after-restart")
    await rig.handled(1)
    instances = await rig.executor.backend.list_instances(1)
    assert [(i.profile, i.start) for i in instances] == [("2g.10gb", 2)]
    assert all(isinstance(m, CmdDone) for m in rig.watch.seen if is_done("c2")(m))
    assert list(rig.executor.backend.running()) == ["j2"]


async def test_a_failed_mig_operation_is_reported_with_its_nvml_code(rig: Rig) -> None:
    rig.executor.backend.fail_next("create", pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)  # type: ignore[attr-defined]
    await rig.send(place("c3", "j3", 0, "1g.5gb", 0))
    failed = await rig.watch.until(is_done("c3"))
    assert isinstance(failed, CmdFailed)
    assert failed.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES and "overlaps" in failed.error
    assert failed.job_id == "j3" and not rig.watch.of(JobStarted)


async def test_a_create_refused_for_overlap_is_followed_by_a_registration_listing_what_the_gpu_holds(
    rig: Rig,
) -> None:
    await rig.watch.until(lambda m: isinstance(m, Registered))
    await rig.send(place("c7", "j7", 0, "3g.20gb", 4, duration=0.01))  # left idle, unknown to the scheduler
    await rig.watch.until(lambda m: isinstance(m, JobExited) and m.job_id == "j7")
    registrations = len(rig.watch.of(Registered))
    await rig.send(place("c8", "j8", 0, "7g.40gb", 0))  # the scheduler's view: the GPU is empty
    failed = await rig.watch.until(is_done("c8"))
    assert isinstance(failed, CmdFailed) and failed.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    again = await rig.watch.until(lambda m: isinstance(m, Registered) and len(rig.watch.of(Registered)) > registrations)
    again = rig.watch.of(Registered)[-1]
    assert rig.watch.seen.index(again) > rig.watch.seen.index(failed)  # after the failure, on the same subject
    (gpu0,) = [g for g in again.gpus if g.index == 0]
    assert [(i.profile, i.start) for i in gpu0.instances] == [("3g.20gb", 4)]


async def test_a_stop_command_ends_the_job_as_cancelled_and_destroys_only_idle_instances(rig: Rig) -> None:
    before = _reconfigurations()
    await rig.send(place("c4", "j4", 0, "7g.40gb", 0))
    await rig.watch.until(is_done("c4"))
    assert _reconfigurations() - before == 1  # the instance created
    busy = Command(
        id="c5",
        cmd_id="c5",
        kind="destroy_idle",
        node=NODE,
        gpu_index=0,
        ops=destroy_ops(0, "7g.40gb", 0, "n1/0:7g.40gb@0:j4"),
        at=now(),
    )
    await rig.send(busy)
    refused = await rig.watch.until(is_done("c5"))
    assert isinstance(refused, CmdFailed) and refused.code == pynvml.NVML_ERROR_IN_USE
    await rig.send(Command(id="c6", cmd_id="c6", kind="stop", node=NODE, gpu_index=0, job_id="j4", at=now()))
    exited = await rig.watch.until(lambda m: isinstance(m, JobExited) and m.job_id == "j4")
    assert exited.exit == "cancelled"
    await rig.send(
        Command(
            id="c7",
            cmd_id="c7",
            kind="destroy_idle",
            node=NODE,
            gpu_index=0,
            ops=destroy_ops(0, "7g.40gb", 0, "n1/0:7g.40gb@0:j4"),
            at=now(),
        )
    )
    assert isinstance(await rig.watch.until(is_done("c7")), CmdDone)
    assert await rig.executor.backend.list_instances(0) == []
    assert _reconfigurations() - before == 2  # and destroyed, by a command that is not a place


def _reconfigurations() -> float:
    return REGISTRY.get_sample_value("migsched_executor_reconfigurations_total", {"node": NODE}) or 0.0


async def test_a_gang_on_mig_gpus_makes_a_full_size_instance_on_each_and_one_run(rig: Rig) -> None:
    from shared.events import GangLaunch, MigMember

    iids = [f"{NODE}/{g}:7g.40gb@0:gm" for g in (0, 1)]
    cmd = Command(
        id="cg", cmd_id="cg", kind="place", node=NODE, gpu_id=f"{NODE}/0", gpu_index=0, job_id="gm",
        instance_id=iids[0], ops=(*create_ops(0, "7g.40gb", 0, iids[0]), *create_ops(1, "7g.40gb", 0, iids[1])),
        mig_members=(MigMember(gpu_index=0, instance_id=iids[0]), MigMember(gpu_index=1, instance_id=iids[1])),
        gang=GangLaunch(world_size=4, first_rank=2, node_rank=1, hosts=("a", NODE), master_addr="a",
                        master_port=29600),
        duration_s=0.3, at=time.time(),
    )
    await rig.send(cmd)
    done = await rig.watch.until(is_done("cg"))
    assert isinstance(done, CmdDone) and done.instance is not None and done.instance.instance_id == iids[0]
    for g in (0, 1):
        assert [(i.profile, i.start) for i in await rig.executor.backend.list_instances(g)] == [("7g.40gb", 0)]
    exited = await rig.watch.until(lambda m: isinstance(m, JobExited) and m.job_id == "gm")
    assert exited.exit == "completed" and exited.instance_id == iids[0]


async def test_a_mig_gang_asked_to_launch_per_node_is_refused_and_leaves_no_instance(rig: Rig) -> None:
    from shared.events import GangLaunch, MigMember

    iid = f"{NODE}/1:7g.40gb@0:pn"
    cmd = Command(
        id="cp", cmd_id="cp", kind="place", node=NODE, gpu_id=f"{NODE}/1", gpu_index=1, job_id="pn",
        instance_id=iid, ops=create_ops(1, "7g.40gb", 0, iid),
        mig_members=(MigMember(gpu_index=1, instance_id=iid),),
        gang=GangLaunch(launch="per-node", world_size=2, first_rank=0, node_rank=0, hosts=(NODE, "b"),
                        master_addr=NODE, master_port=29601),
        at=time.time(),
    )
    await rig.send(cmd)
    failed = await rig.watch.until(lambda m: isinstance(m, CmdFailed) and m.cmd_id == "cp")
    assert "per-node needs non-MIG GPUs" in failed.error
    assert list(await rig.executor.backend.list_instances(1)) == []
