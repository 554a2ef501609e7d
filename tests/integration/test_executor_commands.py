"""The executor against a real NATS (JetStream): registration, heartbeats, commands applied idempotently
through the sim backend, failures reported with their NVML code, job exits, stops and make-before-break moves.

Each test runs one in-process executor in its own namespace and watches its ``node.<node>.*`` subjects with a
plain NATS subscription (JetStream publishes are delivered to core subscribers too).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pynvml
import pytest

from services.executor.service import Executor, ExecutorSettings, build_backend
from shared.bus import JetStreamBus
from shared.events import (
    CmdDone,
    CmdFailed,
    Command,
    Heartbeat,
    JobExited,
    JobStarted,
    Registered,
    Subjects,
    decode,
    now,
)
from shared.mig.geometry import default_geometry
from shared.policy.partition import MigOp
from shared.settings import load

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]
NODE = "n1"
A100 = default_geometry().model("A100-40GB")


class Watch:
    """Every decoded message on ``node.<node>.>`` in arrival order, with a wait-for helper."""

    def __init__(self, subjects: Subjects) -> None:
        self.subjects = subjects
        self.seen: list[Any] = []
        self._new = asyncio.Condition()

    async def on_msg(self, m: Any) -> None:
        self.seen.append(decode(m.subject, m.data, self.subjects))
        async with self._new:
            self._new.notify_all()

    async def until(self, pred: Any, timeout: float = 10.0) -> Any:
        async def wait() -> Any:
            async with self._new:
                while True:
                    for msg in self.seen:
                        if pred(msg):
                            return msg
                    await self._new.wait()

        return await asyncio.wait_for(wait(), timeout)

    def of(self, kind: type) -> list[Any]:
        return [m for m in self.seen if isinstance(m, kind)]


class Rig:
    def __init__(self, bus: JetStreamBus, executor: Executor, watch: Watch) -> None:
        self.bus, self.executor, self.watch = bus, executor, watch
        self.subjects = bus.subjects

    async def send(self, cmd: Command, msg_id: str | None = None) -> None:
        await self.bus.publish(self.subjects.cmd(NODE), cmd, msg_id=msg_id)

    async def handled(self, n: int, timeout: float = 10.0) -> None:
        """Wait until this executor's command consumer has settled ``n`` messages."""

        async def wait() -> None:
            while self.executor._consumer.handled < n:
                await asyncio.sleep(0.02)

        await asyncio.wait_for(wait(), timeout)

    async def restart(self) -> None:
        """A new executor process on the same (simulated) GPUs: it remembers no command."""
        await self.executor.stop()
        self.executor = Executor(self.bus, self.executor.backend, self.executor.settings, NODE)
        await self.executor.start()


@pytest.fixture
async def rig(nats_url: str, prefix: str) -> AsyncIterator[Rig]:
    settings = load(
        ExecutorSettings,
        env={},
        nats_url=nats_url,
        namespace=prefix,
        stream_storage="memory",
        node=NODE,
        executor_gpus="A100-40GB:2",
        executor_reconfig_latency_s=0.01,
        heartbeat_s=0.2,
        metrics_port=0,
        fetch_timeout_s=0.05,
    )
    bus = await JetStreamBus.connect(settings)
    watch = Watch(bus.subjects)
    sub = await bus.nc.subscribe(f"{bus.subjects.root}node.{NODE}.>", cb=watch.on_msg)
    executor = Executor(bus, build_backend(settings, NODE), settings, NODE)
    await executor.start()
    r = Rig(bus, executor, watch)
    try:
        yield r
    finally:
        await r.executor.stop()
        await r.executor.backend.close()
        await sub.unsubscribe()
        await bus.delete_streams()
        await bus.close()


def create_ops(gpu: int, profile: str, start: int, iid: str) -> tuple[MigOp, ...]:
    p = A100.profile(profile)
    return tuple(
        MigOp(
            kind=k,
            gpu_id=f"{NODE}/{gpu}",
            instance_id=iid,
            profile=p.name,
            profile_id=p.profile_id,
            start=start,
            size=p.memory_slices,
        )
        for k in ("create_gi", "create_ci")
    )


def destroy_ops(gpu: int, profile: str, start: int, iid: str) -> tuple[MigOp, ...]:
    p = A100.profile(profile)
    return tuple(
        MigOp(
            kind=k,
            gpu_id=f"{NODE}/{gpu}",
            instance_id=iid,
            profile=p.name,
            profile_id=p.profile_id,
            start=start,
            size=p.memory_slices,
        )
        for k in ("destroy_ci", "destroy_gi")
    )


def place(
    cmd_id: str, job: str, gpu: int, profile: str, start: int, duration: float | None = None
) -> Command:
    iid = f"{NODE}/{gpu}:{profile}@{start}:{job}"
    return Command(
        id=cmd_id,
        cmd_id=cmd_id,
        kind="place",
        node=NODE,
        gpu_id=f"{NODE}/{gpu}",
        gpu_index=gpu,
        ops=create_ops(gpu, profile, start, iid),
        instance_id=iid,
        job_id=job,
        duration_s=duration,
        at=now(),
        submitted_at=now(),
    )


def is_done(cmd_id: str) -> Any:
    return lambda m: isinstance(m, CmdDone | CmdFailed) and m.cmd_id == cmd_id


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
    await rig.send(place("c4", "j4", 0, "7g.40gb", 0))
    await rig.watch.until(is_done("c4"))
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


async def test_a_migration_starts_the_target_before_it_stops_the_source(rig: Rig) -> None:
    await rig.send(place("c8", "j8", 0, "1g.5gb", 3))
    await rig.watch.until(is_done("c8"))
    dst = "n1/1:1g.5gb@6:j8-m1"
    await rig.send(
        Command(
            id="c9",
            cmd_id="c9",
            kind="migrate_start",
            node=NODE,
            gpu_id="n1/1",
            gpu_index=1,
            ops=create_ops(1, "1g.5gb", 6, dst),
            instance_id=dst,
            src_instance_id="n1/0:1g.5gb@3:j8",
            job_id="j8",
            at=now(),
        )
    )
    moved = await rig.watch.until(is_done("c9"))
    assert isinstance(moved, CmdDone) and moved.instance is not None and moved.instance.instance_id == dst
    await rig.send(
        Command(
            id="c10",
            cmd_id="c10",
            kind="migrate_stop",
            node=NODE,
            gpu_index=0,
            job_id="j8",
            src_instance_id="n1/0:1g.5gb@3:j8",
            ops=destroy_ops(0, "1g.5gb", 3, "n1/0:1g.5gb@3:j8"),
            at=now(),
        )
    )
    assert isinstance(await rig.watch.until(is_done("c10")), CmdDone)
    running = rig.executor.backend.running()
    assert (running["j8"].gpu_index, running["j8"].start) == (1, 6)
    assert await rig.executor.backend.list_instances(0) == []
    assert not [m for m in rig.watch.of(JobExited) if m.job_id == "j8"]  # a move is not an exit


async def test_moving_a_job_that_already_ended_creates_no_target_and_reports_the_exit_first(
    rig: Rig,
) -> None:
    await rig.send(place("c11", "j11", 0, "2g.10gb", 0, duration=0.05))
    await rig.watch.until(lambda m: isinstance(m, JobExited) and m.job_id == "j11")
    dst = "n1/0:2g.10gb@4:j11.m1"
    await rig.send(
        Command(
            id="c12",
            cmd_id="c12",
            kind="migrate_start",
            node=NODE,
            gpu_id="n1/0",
            gpu_index=0,
            ops=create_ops(0, "2g.10gb", 4, dst),
            instance_id=dst,
            src_instance_id="n1/0:2g.10gb@0:j11",
            job_id="j11",
            at=now(),
        )
    )
    failed = await rig.watch.until(is_done("c12"))
    assert isinstance(failed, CmdFailed) and "ended" in failed.error
    # the state store removes a target created for a move when it releases the job: the GPU agrees
    assert {(i.profile, i.start) for i in await rig.executor.backend.list_instances(0)} == {("2g.10gb", 0)}
    assert "j11" not in rig.executor.backend.running()
    order = [
        m
        for m in rig.watch.seen
        if getattr(m, "job_id", None) == "j11" and isinstance(m, JobExited | CmdFailed)
    ]
    assert isinstance(order[0], JobExited) and isinstance(order[-1], CmdFailed)


async def test_moving_a_job_that_already_ended_still_destroys_the_idle_instances_in_the_targets_way(
    rig: Rig,
) -> None:
    # The state store drops the idle instances a move destroys when it reserves the target (``migrate.lua``) and
    # never brings them back: a GPU that kept them held slices the state believed free, and every placement
    # there failed (overlap) until its job ran out of attempts (load.stragglers).
    await rig.send(place("c13", "j13", 0, "1g.5gb", 6, duration=0.05))  # leaves an idle 1g.5gb@6
    await rig.send(place("c14", "j14", 0, "2g.10gb", 0, duration=0.05))
    for job in ("j13", "j14"):
        await rig.watch.until(lambda m, job=job: isinstance(m, JobExited) and m.job_id == job)
    dst = "n1/0:3g.20gb@4:j14.m1"
    await rig.send(
        Command(
            id="c15",
            cmd_id="c15",
            kind="migrate_start",
            node=NODE,
            gpu_id="n1/0",
            gpu_index=0,
            ops=(*destroy_ops(0, "1g.5gb", 6, "n1/0:1g.5gb@6:j13"), *create_ops(0, "3g.20gb", 4, dst)),
            instance_id=dst,
            src_instance_id="n1/0:2g.10gb@0:j14",
            job_id="j14",
            at=now(),
        )
    )
    failed = await rig.watch.until(is_done("c15"))
    assert isinstance(failed, CmdFailed) and "ended" in failed.error
    # no target, and the idle instance in its way is gone, as it is from the state
    assert {(i.profile, i.start) for i in await rig.executor.backend.list_instances(0)} == {("2g.10gb", 0)}


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
