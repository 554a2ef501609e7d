"""How the executor carries out one command: the MIG ops through the instance book, then the workload.

Every path is idempotent: a replayed command finds its ops done and its workload running, and skips them. A
``place`` or ``migrate_start`` that fails after creating instances destroys them again (``instances.undo``):
the state store forgets a failed placement's or an aborted move's instance, so the GPU must too. Stops are the
exception: a replay could end a run placed since, on an instance of the same id (a ``stop`` of a foreign run,
a gang member's ``stop``), or any run here (a ``resync``, a ``place`` that preempts: ``stop_jobs``). So the
commands that carried out their stops are remembered by id for as long as a message may come back
(``redelivery_horizon_s``, past the executor's redelivery window), and a replay skips the stops (a stop command
does nothing more; a place goes on and finds its work done).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec
from opentelemetry import context as otel_context

from services.common.recent import Recent
from services.executor.backend import Backend, BackendError, InstanceInfo, WorkloadError, WorkloadSpec
from services.executor.exits import ExitReports
from services.executor.instances import InstanceBook, gpu_index_of, report, undo
from services.executor.launch import Proc, gang_procs
from services.executor.plain import plain_target
from services.executor.registration import Registration
from services.executor.runs import Runs
from shared.errors import MigschedError
from shared.events import CmdDone, Command, now
from shared.policy.partition import MigOp

log = logging.getLogger("migsched.executor")

STOPPERS_KEPT = 65536
"""Hard cap of ``Commands.stopped`` (a safety net: the redelivery horizon bounds it, ~rate × horizon)."""


def lane_of(cmd: Command, backend: Backend) -> int:
    """The GPU a command works on (its lane: one GPU's commands apply in order); -1 when none is named."""
    if cmd.gpu_index is not None:  # nearly always: asked several times per command, so no scan first
        return cmd.gpu_index
    for candidate in (gpu_index_of(cmd.gpu_id), *(gpu_index_of(op.gpu_id) for op in cmd.ops)):
        if candidate is not None:
            return candidate
    job = cmd.job_id or (cmd.stop_jobs[0] if cmd.stop_jobs else None)
    info = backend.running().get(job) if job else None
    return info.gpu_index if info is not None else -1


class Commands:
    def __init__(self, backend: Backend, book: InstanceBook, node: str, settings: Any, metrics: Any, runs: Runs,
                 exits: ExitReports, registration: Registration,
                 gpu_locks: Mapping[int, asyncio.Lock] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self.book = book
        self.node = node
        self.settings = settings
        self.metrics = metrics
        self.runs = runs
        self.exits = exits
        self.registration = registration
        self.gpu_locks: Mapping[int, asyncio.Lock] = gpu_locks if gpu_locks is not None else defaultdict(asyncio.Lock)
        """Each GPU's lane lock (the caller holds the command's own lane): a gang's command on MIG GPUs takes its
        other GPUs' too while it changes them."""
        self.stopped: Recent[None] = Recent(settings.redelivery_horizon_s, STOPPERS_KEPT, clock=clock)
        """Commands whose stops were carried out to the end (a resync's registration sent too)."""

    async def apply(self, cmd: Command, ctx: otel_context.Context) -> list[Any]:
        """Carry out one command; the reports to publish (raises MigschedError when it cannot be done)."""
        at = now()
        done = CmdDone(
            id=f"{cmd.cmd_id}.done",
            node=self.node,
            at=at,
            cmd_id=cmd.cmd_id,
            command=cmd.kind,
            job_id=cmd.job_id,
        )
        if cmd.kind in ("stop", "migrate_stop", "resync"):
            return await self._stop(cmd, done)
        if cmd.kind == "destroy_idle":
            await self._ops(cmd)
            return [done]
        if not cmd.job_id or not cmd.instance_id:
            raise WorkloadError(f"a {cmd.kind} command needs job_id and instance_id")
        if cmd.kind == "migrate_start" and cmd.job_id not in self.backend.running():
            src_node = (cmd.src_instance_id or "").split("/", 1)[0]
            if src_node == self.node:  # its source copy was here and is gone: the job ended meanwhile
                await self._refuse_move_of_ended(cmd)
        created: list[InstanceInfo] = []
        try:
            return await self._start(cmd, ctx, done, created)
        except MigschedError as exc:
            left = await undo(self.backend, self.book, created)
            if left:
                raise BackendError(
                    f"{exc}; could not undo: {'; '.join(left)}", code=getattr(exc, "code", None)
                ) from exc
            raise

    async def _stop(self, cmd: Command, done: CmdDone) -> list[Any]:
        """A ``stop``, ``migrate_stop`` or ``resync``: the runs it names stopped, then its ops (idempotent on the
        command's id)."""
        if cmd.cmd_id in self.stopped:
            log.info("%s %s was carried out before: a run here now was placed since; none is stopped",
                     cmd.kind, cmd.cmd_id)
            return [done]
        # A resync means the scheduler holds no job on this node (lost: all re-queued; unknown: never
        # registered), so every workload here runs unbeknown to it, including ones started after the
        # heartbeat that ``stop_jobs`` was read from; left running, registration would report their
        # instances and the scheduler would adopt them idle and place other jobs on them (refused).
        resync = (*cmd.stop_jobs, *(j for j in self.backend.running() if j not in cmd.stop_jobs))
        for job in resync if cmd.kind == "resync" else (cmd.job_id,):
            if not job:
                continue
            if cmd.kind == "migrate_stop":
                if not self._runs_on(job, cmd.src_instance_id):
                    continue  # moved within this node already (make-before-break in the backend)
                self.runs.retired.add(job)
            elif cmd.kind == "stop" and (
                    (cmd.src_instance_id and not self._runs_on(job, cmd.src_instance_id))
                    or cmd.src_cmd_id not in (None, self.runs.started_by.get(job, cmd.src_cmd_id))):
                # a stop of one run (one a place command applied late started): the job runs elsewhere
                # here, or was started again by a later command (its current placement, maybe on an instance
                # of the same id), or no more, and that is not this stop's to end
                continue
            self._log_stop(cmd, job)
            await self.backend.stop_workload(job)
        await self._ops(cmd)
        if cmd.kind == "resync":
            await self.registration.register()
        self.stopped.put(cmd.cmd_id, None)
        return [done]

    async def _refuse_move_of_ended(self, cmd: Command) -> None:
        """A ``migrate_start`` whose source copy ran here and is gone: the job ended meanwhile. Nothing is
        created: the state store removes a target created for a move when the job's exit is released (and when
        the move is aborted), whichever comes first. The exit goes out before this failure, so the registry
        releases the job before it aborts the (already ended) move."""
        await self.exits.reported(cmd.job_id or "", timeout=5.0)
        # The idle instances in the target's way are destroyed all the same: the state store dropped them when it
        # reserved the target and an abort does not bring them back, so a GPU that kept them would hold slices
        # the state believes free (every placement there refused for overlap).
        destroys = tuple(op for op in cmd.ops if op.kind in ("destroy_ci", "destroy_gi"))
        kept = ""
        if destroys:
            try:
                await self._ops(msgspec.structs.replace(cmd, ops=destroys))
            except MigschedError as exc:
                kept = f"; the idle instances in its way were not all destroyed: {exc}"
        raise WorkloadError(
            f"cannot move job {cmd.job_id}: it ended on {self.node} before the move; the target "
            f"instance {cmd.instance_id} is not created{kept}"
        )

    async def _start(
        self, cmd: Command, ctx: otel_context.Context, done: CmdDone, created: list[InstanceInfo]
    ) -> list[Any]:
        """``place`` / ``migrate_start``: the ops, then the workload on the target instance."""
        assert cmd.job_id is not None and cmd.instance_id is not None
        if cmd.kind == "place":
            await self._stop_preempted(cmd)
        bindings: tuple[InstanceInfo, ...] = ()
        if cmd.plain:  # whole GPU(s) or a time-sliced share: no MIG operation, bound to the GPUs themselves
            if cmd.kind != "place" or cmd.ops:
                raise WorkloadError(f"{cmd.cmd_id}: plain GPU slots come only in a place command without ops")
            target = plain_target(cmd, await self.backend.discover())
        elif cmd.mig_members:  # a gang on full-size MIG instances: one per GPU, one process each
            bindings = await self._members(cmd, created)
            target = bindings[0]
        else:
            await self._ops(cmd, created)
            lane = lane_of(cmd, self.backend)
            found = await self.book.find(lane, cmd.instance_id)
            if found is None:
                raise WorkloadError(f"instance {cmd.instance_id} does not exist on GPU {lane} of {self.node}")
            target = found
        spec = WorkloadSpec(
            argv=cmd.workload.argv,
            env=cmd.workload.env,
            run_as=cmd.workload.run_as,
            duration_s=self._remaining(cmd),
            procs=self._procs(cmd),
            bindings=bindings,
            started_by=cmd.cmd_id,
        )
        started = True
        if cmd.kind == "migrate_start" and cmd.job_id in self.backend.running():
            await self._move(cmd.job_id, target, spec)
        elif cmd.kind == "migrate_start":
            # the source copy runs on another node: start here; that node stops it on migrate_stop
            await self.backend.start_workload(cmd.job_id, target, spec)
            self.metrics.migrated()
        else:
            self.runs.start_reported[cmd.job_id] = asyncio.Event()  # set once the cmd_done is out (``exits``)
            started = await self.backend.start_workload(cmd.job_id, target, spec)
        self.runs.ctx[cmd.job_id] = ctx
        self.runs.instance[cmd.job_id] = (cmd.instance_id, target.gpu_index, target.gi_id)
        # a place for the run the job already has on this instance (a command applied late, for an earlier
        # placement the same instance id stood for) started nothing, so it does not claim that run: a stop of
        # the late command's run would otherwise end the job's current one
        if started:
            self.runs.started_by[cmd.job_id] = cmd.cmd_id
        if cmd.job_id not in self.runs.started or (cmd.kind == "place" and started):
            self.runs.started[cmd.job_id] = (time.monotonic(), cmd.duration_s)
        # a plain binding is no MIG instance to report (the registry knows its instance ids already)
        inst = None if target.plain else report(target, cmd.instance_id, cmd.job_id)
        done = CmdDone(
            id=done.id,
            node=self.node,
            at=now(),
            cmd_id=cmd.cmd_id,
            command=cmd.kind,
            job_id=cmd.job_id,
            instance=inst,
        )
        # A place's cmd_done is its start report: the registry marks the job running on it (an executor no
        # longer sends job_started, which only repeated it: one report, one Lua call and one publish per job).
        return [done]

    @staticmethod
    def _procs(cmd: Command) -> tuple[Proc, ...]:
        """A gang's processes on this node (``services.executor.launch``); none for any other job."""
        if cmd.gang is None or not (cmd.plain or cmd.mig_members):
            return ()
        if cmd.mig_members and cmd.gang.launch == "per-node":
            raise WorkloadError(f"{cmd.cmd_id}: launch per-node needs non-MIG GPUs (a process sees one MIG device)")
        return gang_procs(cmd.gang, [m.gpu_index for m in (cmd.mig_members or cmd.plain)])

    async def _members(self, cmd: Command, created: list[InstanceInfo]) -> tuple[InstanceInfo, ...]:
        """Make a MIG gang's members on this node: each GPU's ops under that GPU's lane lock (the command's own
        lane is held by the caller), then every member instance as the backend sees it."""
        by_gpu: dict[int, list[MigOp]] = {}
        for op in cmd.ops:
            index = gpu_index_of(op.gpu_id)
            if index is None:
                raise WorkloadError(f"{cmd.cmd_id}: op on {op.gpu_id}, which names no GPU of this node")
            by_gpu.setdefault(index, []).append(op)
        lane = lane_of(cmd, self.backend)
        for index in sorted(by_gpu):
            busy = {(index, gi) for gi in self.backend.jobs_on(index)}
            if index == lane:
                await self._apply(index, by_gpu[index], busy, created)
                continue
            async with self.gpu_locks[index]:
                await self._apply(index, by_gpu[index], busy, created)
        found = []
        for m in cmd.mig_members:
            info = await self.book.find(m.gpu_index, m.instance_id)
            if info is None:
                raise WorkloadError(f"instance {m.instance_id} does not exist on GPU {m.gpu_index} of {self.node}")
            found.append(info)
        return tuple(found)

    async def _stop_preempted(self, cmd: Command) -> None:
        """A placement that preempted jobs: stop their workloads before the ops destroy or reuse their
        instances. The state store re-queued them already, so their stop is not reported as an exit. Once only:
        on a replay a victim running here again was placed anew since, and stopping it would lose it (its exit is
        not reported)."""
        if not cmd.stop_jobs:
            return
        if cmd.cmd_id in self.stopped:
            log.info("place %s stopped its victims before: a victim running here now was placed since, and is "
                     "left running", cmd.cmd_id)
            return
        for job in cmd.stop_jobs:
            if job == cmd.job_id or job not in self.backend.running():
                continue  # a replayed command: stopped already
            self.runs.retired.add(job)
            await self.backend.stop_workload(job)
        self.stopped.put(cmd.cmd_id, None)

    async def _ops(self, cmd: Command, created: list[InstanceInfo] | None = None) -> int:
        if not cmd.ops:
            return 0
        # only a destroy needs the running instances, and only those of the command's GPU (``book.apply`` asks
        # about no other): a snapshot of that GPU's, not a pass over every running job
        lane = lane_of(cmd, self.backend)
        destroys = any(op.kind == "destroy_gi" for op in cmd.ops)
        busy = {(lane, gi) for gi in self.backend.jobs_on(lane)} if destroys else set()
        return await self._apply(lane, cmd.ops, busy, created)

    async def _apply(self, lane: int, ops: Sequence[MigOp], busy: set[tuple[int, int]],
                     created: list[InstanceInfo] | None) -> int:
        """``book.apply``, counting the GPU instances it created or destroyed: those of every command (a place,
        a move, the destroys of a stop or of an idle instance), not only a place's or a move's."""
        changed = await self.book.apply(lane, ops, busy, created)
        if changed:
            self.metrics.reconfigured(changed)
        return changed

    def _log_stop(self, cmd: Command, job: str) -> None:
        """Which run a stop ends, and why it took it for the run it names: a stop of one run that ends a run it
        cannot tell apart (no name for its instance, no record of the command that started it) is a warning,
        the trail to follow when a job is cancelled that should have run on; so is every stop of a resync."""
        info = self.backend.running().get(job)
        name = None if info is None else self.book.name_of(info)
        by = self.runs.started_by.get(job)
        blind = (cmd.src_instance_id is not None and name is None) or (cmd.src_cmd_id is not None and by is None)
        # a resync ends every run here: the node was lost to the scheduler, which operators want to see
        (log.warning if blind or cmd.kind == "resync" else log.info)(
            "%s %s ends %s on %s (started by %s; the stop names %s, started by %s)", cmd.kind, cmd.cmd_id, job,
            name or "an instance it cannot name", by or "an unknown command", cmd.src_instance_id or "any run",
            cmd.src_cmd_id or "any command")

    def _runs_on(self, job: str, instance_id: str | None) -> bool:
        info = self.backend.running().get(job)
        return info is not None and (instance_id is None or self.book.name_of(info) in (instance_id, None))

    def _remaining(self, cmd: Command) -> float | None:
        """A moved job keeps the rest of its run (sim durations are in simulated seconds)."""
        if cmd.kind != "migrate_start" or cmd.job_id not in self.runs.started:
            return cmd.duration_s
        started, duration = self.runs.started[cmd.job_id]
        if duration is None:
            return cmd.duration_s
        elapsed = (time.monotonic() - started) * (
            self.settings.executor_speedup if self.backend.name == "sim" else 1.0
        )
        return max(0.0, duration - elapsed)

    async def _move(self, job_id: str, target: InstanceInfo, spec: WorkloadSpec) -> None:
        """Make before break: the backend starts the target copy, confirms it, then stops the source."""
        current = self.backend.running().get(job_id)
        if current is not None and (current.gpu_index, current.gi_id) == (target.gpu_index, target.gi_id):
            return  # a replayed migrate_start: the move is done
        mover = getattr(self.backend, "move_workload", None)
        if mover is None:
            raise WorkloadError(f"the {self.backend.name} backend cannot move workloads")
        confirm = self.settings.executor_confirm_s
        if self.backend.name == "sim":
            confirm /= self.settings.executor_speedup
        await mover(job_id, target, spec, confirm_s=confirm)
        self.metrics.migrated()
