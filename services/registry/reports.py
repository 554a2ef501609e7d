"""What executors report (``node.<node>.report``), turned into state transitions by the registry.

- ``cmd_done``: place -> mark running (and count the profile as recent demand for retention); migrate_start ->
  send migrate_stop for the source; migrate_stop -> commit the move; destroy_idle -> drop the instance (its
  slices are free: capacity changed).
- ``cmd_failed``: place -> release the reservation and re-queue the job (or fail it after max attempts), then
  a capacity signal so the balancer re-decides it; migrate_start -> abort the move; destroy_idle -> the
  instance is idle again.
- ``job_started`` (executors before the cmd_done of a place became the start report): mark running, a no-op
  after the cmd_done.
- ``job_exit``: release (the first release frees the slices), re-publish as ``jobs.exit`` for the balancer and
  the migration planner, then keep or destroy the instance the job left (``idle``). Each node of a gang across
  nodes reports its own part's exit: a part that completed while others run frees its GPUs (a capacity signal,
  no ``jobs.exit``); any other end of a part ends the job and sends every other member node a ``stop``. An exit
  naming another instance than the job's current one (a late message from before a re-queue) is stale and
  ignored. An exit during a move whose ops may not have run gives back the idle instances the move had
  removed from its target's way (``given_back``, held ``retiring``): each gets a ``destroy_idle``.
- a place's ``cmd_done`` for a command the state no longer expects (of an older attempt than the job's: it
  timed out, or the job was re-queued, re-placed, failed, finished or cancelled since; an executor restarted
  mid-load applies such commands late) started a second run: its instance is held ``retiring`` for it and the
  node gets a ``stop`` of that run only (``src_instance_id``), id ``stop:<job>:<place command id>``; the job's
  own placement is untouched. A ``cmd_failed`` or time-out of such a command is a no-op.
- a job that ran on the node unbeknown to the state (found by a registration, or the late run above, whose
  instance was kept ``retiring`` and the job sent a ``stop``): its exit, or the stop's ``cmd_done``, makes the
  instance idle.
- ``registered`` / ``drift``: the nodes (``nodes``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from services.common import metrics as common
from services.common.metric_cache import child
from services.common.recent import Recent
from services.common.service import Context
from services.common.stop_command import stop_command
from services.registry import metrics as m
from services.registry.commands import member_stops, place_attempt
from services.registry.idle import IdleInstances
from services.registry.moves import move_target_tail, source_stop
from shared import telemetry
from shared.bus import Delivery, Outgoing
from shared.events import (
    CapacityChanged,
    CmdDone,
    CmdFailed,
    Command,
    JobExit,
    JobExited,
    JobStarted,
    SlotRef,
)
from shared.policy.retention import demand_instant
from shared.state import StoredInstance, gpu_id_of
from shared.state.model import PLAIN_PROFILES

APPLIED_EXITS_S = 60.0
"""How long this process remembers an exit report it applied: past the ten seconds a heartbeat repeats it, with
room for a heartbeat consumer that lags."""
APPLIED_EXITS_MAX = 100_000
"""Hard cap of the remembered exits (a safety net: the window bounds them, ~rate × window)."""


class _Effects:
    """What one batch of reports leads to once its transitions ran."""

    def __init__(self, gone: Any) -> None:
        self.out: list[Outgoing] = []
        self.freed: list[str] = []
        """GPUs with room freed: one capacity signal names them all."""
        self.left: list[tuple[Any, str, Any]] = []
        """(GPU after the release, instance the job left, span): kept or destroyed once the exits are out."""
        self.ended: list[tuple[str, str]] = []
        """(node, job) gone from the node: an instance kept for it may idle."""
        self.gone = gone
        """A batch of reused instances a node lacks, dropped."""


class Reports:
    def __init__(self, ctx: Context, idle: IdleInstances,
                 on_registered: Callable[[Delivery], Awaitable[None]]) -> None:
        self.state = ctx.state
        self.bus = ctx.bus
        self.subjects = ctx.bus.subjects
        self.settings = ctx.settings
        self.geometry = ctx.geometry
        self.log = ctx.log
        self.idle = idle
        self.on_registered = on_registered
        self.applied: Recent[None] = Recent(APPLIED_EXITS_S, APPLIED_EXITS_MAX)
        """The ids of the exit reports this process applied lately: a heartbeat that lists one again is told
        nothing new (``MissedExits``)."""
        self.latest: dict[str, float] = {}
        """Per node, the newest ``at`` of the reports this process received from it: a node's reports come in
        the order it sent them, so an exit it sent earlier and never received here was skipped."""

    async def on_report(self, ds: list[Delivery]) -> None:
        """A node's reports in the order it sent them: the transitions of the reports before a registration are
        applied before it (an executor re-registers right after a placement refused for overlap, so that the
        registration, which adopts the instance the state did not know, sees the refused slot freed)."""
        run: list[Delivery] = []
        for d in ds:
            if d.data.__struct_config__.tag == "registered":
                if run:
                    await self.apply(run)
                    run = []
                await self.on_registered(d)
            else:
                run.append(d)
        if run:
            await self.apply(run)
        latest = self.latest
        for d in ds:
            r = d.data
            if r.at > latest.get(r.node, 0.0):
                latest[r.node] = r.at

    async def apply(self, ds: list[Delivery]) -> None:
        """Reports other than registrations, in order, as one batch of transitions."""
        await self.state.locate(d.data.node for d in ds)  # a node's block may name its shard
        now = time.time()
        b = self.state.batch()
        fx = _Effects(self.state.batch())
        after = self._queue(b, ds, now, fx)
        results: list[Any] = []
        if len(b):
            with telemetry.step("registry apply reports", [d.ctx for d in ds]):
                results = await b.run()
        for d, idx, what in after:
            if what == "done" and d.data.command == "migrate_start":
                fx.out.extend(await self._stop_source(d, d.data, now))
            elif idx < 0:
                continue
            elif what == "exit":
                await self._after_exit(d, results[idx], now, fx)
            elif what == "done":
                self._after_done(d, results[idx], now, fx)
            else:
                await self._after_failed(d, results[idx], now, fx)
        await self._publish(ds, now, fx)
        for d, _, what in after:
            if what == "exit":
                self.applied.put(d.data.id, None)

    def _queue(self, b: Any, ds: list[Delivery], now: float, fx: _Effects) -> list[tuple[Delivery, int, str]]:
        """Each report's transition queued on ``b``: (the report, its result's index, what it was)."""
        after: list[tuple[Delivery, int, str]] = []
        for d in ds:
            r = d.data
            kind = r.__struct_config__.tag
            if kind == "drift":
                self.log.warning("drift on %s: %s", r.node, "; ".join(r.details))
            elif isinstance(r, CmdDone):
                after.append((d, self._done(b, r, now), "done"))
                if r.command == "stop" and r.job_id:
                    fx.ended.append((r.node, r.job_id))
            elif isinstance(r, CmdFailed):
                after.append((d, self._failed(b, r, now), "failed"))
            elif isinstance(r, JobStarted):
                b.mark_running(r.job_id, r.instance_id, now)
            elif isinstance(r, JobExited):
                iid = r.instance_id or ""
                attempt = place_attempt(r.started_by, r.job_id) if r.started_by else None
                after.append((d, b.release(r.job_id, r.exit, r.reason or f"exit {r.exit}", now, iid, r.node,
                                           attempt, r.id), "exit"))
        return after

    async def _after_exit(self, d: Delivery, res: Any, now: float, fx: _Effects) -> None:
        r = d.data
        if res.status == "member":  # one node of a gang across nodes completed its part
            fx.freed.extend(g for g, _ in res.slots)
            return
        fx.out.extend(self._exit_out(d, r, res, now))
        if res.status != "ok":  # not the state's copy: perhaps one a registration found and stopped
            fx.ended.append((r.node, r.job_id))
            return
        if res.stops:  # the other nodes of a gang across nodes stop their parts
            fx.out.extend(Outgoing(self.subjects.cmd(c.node), c, d.ctx)
                          for c in member_stops(r.job_id, res.stops, now))
        if res.stop:
            fx.out.append(self._stop_target(d, r, res.stop, now))
        if res.given_back:  # the move's ops may not have run: destroy them
            fx.out.extend(await self.idle.destroy_given_back(res.given_back, now))
        if res.gpu is not None and r.instance_id:
            fx.left.append((res.gpu, r.instance_id, d.span))

    def _after_done(self, d: Delivery, res: Any, now: float, fx: _Effects) -> None:
        r = d.data
        if r.command == "place" and res == "stop":
            fx.out.append(self._stop_late(d, r, now))
        elif r.command == "migrate_stop" and res[0] == "ok":
            fx.freed.append(res[1].split("|", 1)[0])  # the source's GPU
            child(common.MIGRATIONS, "move", "committed").inc()
        elif r.command == "destroy_idle" and res == "ok":
            fx.freed.append(_gpu_of(r))

    async def _after_failed(self, d: Delivery, res: Any, now: float, fx: _Effects) -> None:
        r = d.data
        if r.command == "place" and res[0] == "ok":
            fx.freed.extend(g for g in res[2].split(",") if g)  # a gang frees several GPUs
            fx.out.extend(Outgoing(self.subjects.cmd(c.node), c, d.ctx)  # members of a gang that started
                          for c in member_stops(r.job_id, res.stops, now))
            missing = _MISSING.search(r.error)
            if missing and res[2]:  # a reused instance the node lacks: forget it, or it is reused (and fails) again
                fx.gone.instance("drop", r.node, res[2].split(",")[0], missing.group(1), now)
            self.log.info("placement of %s failed on %s (%s): job now %s", r.job_id, r.node, r.error, res[1])
        elif r.command == "migrate_start":
            child(common.MIGRATIONS, "move", "aborted").inc()
            if res[0] == "ok" and res[1]:
                fx.out.extend(await self.idle.destroy_given_back(res[1], now))

    async def _publish(self, ds: list[Delivery], now: float, fx: _Effects) -> None:
        """The follow-up transitions, then one capacity signal for every GPU freed and the messages, then the
        instances the exited jobs left kept or destroyed."""
        if len(fx.gone):
            await fx.gone.run()
        for node, job in dict.fromkeys(fx.ended):  # rare (stops, stale exits): one script each
            fx.freed.extend((await self.state.node_stopped(node, job, now))["gpus"])
        if fx.freed:
            cap_id = f"cap-{ds[0].msg.stream_seq}-{ds[0].subject}".replace(".", "-")[:200]
            cap = CapacityChanged(id=cap_id, gpu_ids=tuple(sorted(set(fx.freed))), reason="instances freed", at=now)
            fx.out.append(Outgoing(self.subjects.sched_capacity, cap))
        if fx.out:
            await self.bus.publish_batch(fx.out)
        if fx.left:  # after jobs.exit is out: the balancer hears of the room first
            await self.idle.retain_or_destroy(fx.left)

    def _done(self, b: Any, r: CmdDone, now: float) -> int:
        child(m.COMMANDS, r.command, "done").inc()
        if r.command == "place" and r.job_id:
            iid = r.instance.instance_id if r.instance and r.instance.instance_id else ""
            if r.instance is not None and r.instance.profile and r.instance.profile not in PLAIN_PROFILES:
                # the recent demand the keep-or-destroy policy weighs: counted where the registry sees every
                # placement (the balancer sends the commands), one entry per instant
                self.idle.demand.observe(r.instance.profile, demand_instant(now, self.idle.retention.window_s))
            attempt = place_attempt(r.cmd_id, r.job_id)
            found = self._reported(r) if attempt is not None else None
            return int(b.mark_running(r.job_id, iid or "", now, r.cmd_id, attempt, r.node, found))
        if r.command == "migrate_stop" and r.job_id:
            return int(b.migrate_finish("commit", r.job_id, "moved: target started, source stopped", now))
        if r.command == "destroy_idle":
            iid = _instance_of(r.cmd_id)
            return int(b.instance("drop", r.node, iid.split(":", 1)[0], iid, now)) if iid else -1
        if r.command == "migrate_start":
            return -2  # handled after the batch (needs the job's source)
        return -1

    def _failed(self, b: Any, r: CmdFailed, now: float) -> int:
        child(m.COMMANDS, r.command, "failed").inc()
        reason = f"executor on {r.node} failed {r.command}: {r.error}"[:1000]
        if r.command == "place" and r.job_id:
            attempt = place_attempt(r.cmd_id, r.job_id)
            return int(b.fail_placement(r.job_id, reason, now, self.settings.max_attempts, r.cmd_id, attempt))
        if r.command == "migrate_start" and r.job_id:
            # the idle instances the move removed from its target's way may be destroyed or not: kept retiring
            # and sent a destroy_idle each. A job that ended first had its target on this node kept for a stop:
            # the node undid it, so it is dropped (``lua/migrate.lua`` abort).
            return int(
                b.migrate_finish(
                    "abort", r.job_id, reason, now, "destroy", r.node, move_target_tail(r.cmd_id, r.job_id)
                )
            )
        if r.command == "destroy_idle":
            iid = _instance_of(r.cmd_id)
            return int(b.instance("restore", r.node, iid.split(":", 1)[0], iid, now)) if iid else -1
        return -1

    def _reported(self, r: CmdDone) -> StoredInstance | None:
        """The MIG instance a place's ``cmd_done`` reports, as the state would store it: what holds a run the
        state no longer expects when the failed placement had removed its instance (``mark_running.lua``)."""
        i = r.instance
        if i is None or not i.instance_id:
            return None
        compute = next(
            (mo.profile(i.profile).compute_slices for mo in self.geometry.models if mo.has_profile(i.profile)),
            None,
        )
        if compute is None:
            return None
        return StoredInstance(id=i.instance_id, profile=i.profile, start=i.start, size=i.size, compute=compute)

    def _stop_late(self, d: Delivery, r: CmdDone, now: float) -> Outgoing:
        """A ``stop`` of the run a late place command started, and of that run only: ``src_instance_id`` makes
        the executor leave the job alone where it runs on another instance (its current placement on the same
        node). Its id names the command, so a redelivered ``cmd_done`` sends the same stop (dropped)."""
        iid = r.instance.instance_id if r.instance and r.instance.instance_id else None
        gpu = iid.split(":", 1)[0] if iid else None
        self.log.warning(
            "node %s started %s for %s, which the state no longer expects; stopping that run", r.node, r.job_id,
            r.cmd_id,
        )
        cmd = stop_command(r.node, r.job_id, f"stop:{r.job_id}:{r.cmd_id}", gpu, iid, now, only_that_run=True,
                           started_by=r.cmd_id)
        return Outgoing(self.subjects.cmd(r.node), cmd, d.ctx)

    def _stop_target(self, d: Delivery, r: JobExited, stop: tuple[str, str, str], now: float) -> Outgoing:
        """The job ended from the source copy of a move to another node: that node created the target and may
        run the job's copy there. The release kept the target ``retiring`` with the job; stop that run only
        (its exit or this stop's ``cmd_done`` idles the instance, ``node_stopped``)."""
        node, gpu, iid = stop
        self.log.warning("%s ended on %s during its move to %s; stopping the target copy", r.job_id, r.node, iid)
        cmd = stop_command(node, r.job_id, f"stop:{r.job_id}:{iid}", gpu, iid, now, only_that_run=True)
        return Outgoing(self.subjects.cmd(node), cmd, d.ctx)

    def _exit_out(self, d: Delivery, r: JobExited, res: Any, now: float) -> list[Outgoing]:
        if res.status == "stale" or (res.status == "noop" and not res.state):
            self.log.info("ignored exit of %s from %s: %s", r.job_id, r.node, res.status)
            return []
        if res.status == "noop" and not res.gpu_id and (d.deliveries <= 1 or r.instance_id):
            # the job was released already. The report that released it, redelivered (this process, or one
            # before it, may have crashed or lost its server between the release and this publish), comes back
            # with the GPU (release.lua keeps the report's id) and its exit is published again (the same id:
            # JetStream drops it if it went out); so is a redelivered exit naming no instance. The delivery count
            # cannot tell alone: a consumer's new leader may count a redelivery as the first. Any other report is
            # the exit of another copy of the job (both copies of a move ending on their own, or a run started
            # again by a command an executor applied late after a restart): the job's exit went out already.
            self.log.info("ignored exit of %s from %s: released already", r.job_id, r.node)
            return []
        gpu = res.gpu_id or gpu_id_of(r.node, r.gpu_index or 0)
        iid = r.instance_id or res.instance_id or ""
        e = JobExit(
            id=f"exit:{r.job_id}:{iid or r.id}"[:200],
            job_id=r.job_id,
            node=r.node,
            gpu_id=gpu,
            instance_id=iid or "unknown",
            status=r.status,
            kind=r.exit,
            reason=r.reason,
            at=r.at,
            profile=res.profile or None,
            slots=tuple(SlotRef(gpu_id=g, instance_id=i) for g, i in res.slots),
        )
        return [Outgoing(self.subjects.jobs_exit, e, d.ctx)]

    async def _stop_source(self, d: Delivery, r: CmdDone, now: float) -> list[Outgoing]:
        job = await self.state.job(r.job_id or "")
        target = r.instance.instance_id if r.instance else None
        ended = job is not None and job.state in ("finished", "failed", "cancelled", "rejected")
        if job is not None and ended and target and job.inst != target:
            # the job ended while its target copy was starting on r.node: retire that copy without an exit
            # (the executor's migrate_stop stops the copy on src_instance_id and reports no job exit)
            cid = r.cmd_id.removesuffix(":start") + ":orphan"
            tail = target.split(":", 1)[0].rsplit("/", 1)[-1]
            orphan = Command(
                id=cid,
                cmd_id=cid,
                kind="migrate_stop",
                node=r.node,
                gpu_index=int(tail) if tail.isdigit() else None,
                src_instance_id=target,
                job_id=r.job_id,
                at=now,
            )
            return [Outgoing(self.subjects.cmd(r.node), orphan, d.ctx)]
        if job is None or job.state != "migrating":
            return []
        cmd = source_stop(job, r.cmd_id.removesuffix(":start") + ":stop", now)
        return [Outgoing(self.subjects.cmd(job.node), cmd, d.ctx)]


# services/executor/commands.py: a place command whose (reused) instance is not on the GPU
_MISSING = re.compile(r"instance (\S+) does not exist on GPU")


def _instance_of(cmd_id: str) -> str:
    return cmd_id.removeprefix("destroy:") if cmd_id.startswith("destroy:") else ""


def _gpu_of(r: CmdDone) -> str:
    iid = _instance_of(r.cmd_id)
    return iid.split(":", 1)[0] if iid else ""
