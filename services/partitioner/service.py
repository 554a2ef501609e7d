"""The partitioner: the node registry, and the executor commands that follow a move, an exit or a cancel.

The balancer sends each placement's ``place`` command itself (``services.common.place_command``), and its
reservation tracks the command in Redis (``{ns:s}:cmds``) until the executor reports; this service times it out
(``registry``) and turns the reports into transitions (``reports``).

- ``sched.migrate`` -> ``migrate_start`` on the target node (make before break); its confirmation sends
  ``migrate_stop`` for the source, whose confirmation commits the move (``reports``).
- a job's exit report (``reports``: release, then ``jobs.exit`` for the balancer and the planner) -> keep the
  idle instance for reuse or destroy it (``shared.policy.retention``): retire it in Redis, send
  ``destroy_idle``; the slices are free once it is gone. Done where the release is, not from ``jobs.exit``:
  one consumed message per job less. A crash between that publish and this decision leaves the instance idle
  (reusable, and reclaimable by any placement that needs its slices), never lost.
- ``jobs.cancel`` -> cancel transition; an active job gets a ``stop`` command.
- ``node.*.report`` / ``node.*.heartbeat``: the node registry and command results (``registry``, ``reports``).
- every ``EXPIRE_EVERY_S``: jobs ended longer than ``job_retention_s`` ago, and the oldest beyond
  ``job_retention_max`` per shard, are deleted from Redis (``lua/expire.lua``), so that the state does not
  grow with every job ever submitted.
"""

from __future__ import annotations

import time
from typing import Any

from services.common import metrics as m
from services.common.service import Service
from services.partitioner.registry import RegistryMixin
from services.partitioner.reports import ReportsMixin
from shared.bus import Consumer, Delivery, Outgoing
from shared.events import Command, MigrateOrder
from shared.policy.partition import PartitionPlan, plan_partition
from shared.policy.placement import Slot
from shared.policy.retention import RecentDemand, RetentionParams, keep_idle
from shared.settings import PartitionerSettings
from shared.state import StoredGpu

EXPIRE_EVERY_S = 2.0
"""Sweeps come often and small: at 1,000 jobs/s a sweep every 30 s deleted 30,000 jobs in one burst of Redis
time; every 2 s it deletes ~2,000, in calls of ``EXPIRE_LIMIT``, and costs one short read when nothing is due."""
EXPIRE_LIMIT = 250
"""Jobs one expire call deletes at most: one script never blocks Redis long (~2 ms here; the sweep calls again
while a call deleted this many, so a backlog drains within one sweep, between other clients' commands)."""


class Partitioner(RegistryMixin, ReportsMixin, Service):
    name = "partitioner"
    settings: PartitionerSettings

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        st = self.settings
        self.retention = RetentionParams(window_s=st.retention_window_s, min_share=st.retention_min_share)
        self.demand = RecentDemand(st.retention_window_s)
        self.init_registry()

    def consumers(self) -> list[Consumer]:
        s, b = self.subjects, self.bus
        slow = self.settings.off_path_linger_s  # what nodes report: off the submit -> command path
        return [
            b.consumer(s.stream_sched, "partitioner-migrate", s.sched_migrate, self.on_migrate),
            b.consumer(s.stream_jobs, "partitioner-cancel", s.jobs_cancel, self.on_cancel),
            b.consumer(s.stream_node, "registry-report", s.node_reports, self.on_report, linger_s=slow),
            b.consumer(s.stream_node, "registry-heartbeat", s.node_heartbeats, self.on_heartbeat, linger_s=slow,
                       traced=False),
        ]

    def periodic(self) -> list[tuple[str, float, Any]]:
        st = self.settings
        sweeps = st.job_retention_s > 0 or st.job_retention_max > 0
        return [
            ("liveness", max(0.2, st.node_timeout_s / 5), self.check_liveness),
            ("command-timeouts", max(1.0, st.cmd_timeout_s / 4), self.sweep_commands),
            *([("expire-jobs", EXPIRE_EVERY_S, self.expire_jobs)] if sweeps else []),
        ]

    async def expire_jobs(self) -> int:
        """Delete the jobs of every shard that ended more than ``job_retention_s`` ago, and the oldest beyond
        ``job_retention_max`` that ended before the redelivery horizon -> how many."""
        st = self.settings
        now = time.time()
        before = now - st.job_retention_s if st.job_retention_s > 0 else 0.0  # 0: no job ended before 1970
        settled = now - st.redelivery_horizon_s
        total = 0
        for shard in range(st.shards):
            while (n := await self.state.expire(shard, before, EXPIRE_LIMIT, st.job_retention_max, settled)) > 0:
                total += n
                if n < EXPIRE_LIMIT:
                    break
        if total:
            m.JOBS_EXPIRED.inc(total)
            self.log.info("expired %d ended job(s) (retention %.0f s, at most %d kept per shard)", total,
                          st.job_retention_s, st.job_retention_max)
        return total

    # --- sched.migrate --------------------------------------------------------------------------------------
    async def on_migrate(self, ds: list[Delivery]) -> None:
        now = time.time()
        out: list[Outgoing] = []
        # one read for the batch: a move whose job stopped migrating since the planner reserved it is not started
        jobs = {j.job_id: j for j in await self.state.jobs([d.data.move.job_id for d in ds]) if j is not None}
        for d in ds:
            o: MigrateOrder = d.data
            mv = o.move
            model = self.geometry.model(o.dst_gpu_view.model)
            prof = model.profile(mv.dst_profile)
            slot = Slot(
                gpu_id=mv.dst_gpu,
                node=o.dst_node,
                model=model.name,
                profile=prof.name,
                start=mv.dst_start,
                size=prof.memory_slices,
                compute=prof.compute_slices,
                action="create",
                destroy=mv.destroy,
            )
            plan = plan_partition(o.dst_gpu_view, model, slot, f"{mv.job_id}.{o.nonce}")
            if not isinstance(plan, PartitionPlan) or plan.instance_id != o.dst_instance:
                why = plan.reason if not isinstance(plan, PartitionPlan) else "target instance id mismatch"
                b = self.state.batch()
                # nothing goes out: the idle instances the reserve removed from the target's way are still
                # on the GPU, so the abort restores them idle ('idle')
                b.migrate_finish("abort", mv.job_id, f"migration plan conflict: {why}", now, "idle")
                await b.run()
                m.child(m.MIGRATIONS, mv.kind, "aborted").inc()
                continue
            job = jobs.get(mv.job_id)
            if job is None or job.state != "migrating" or job.mig_inst != o.dst_instance:
                if job is None or job.state != "migrating":
                    out.extend(await self._move_over(d, o, plan, now))
                self.log.info("not starting the move of %s to %s: no longer planned", mv.job_id, o.dst_instance)
                continue
            cid = f"mig:{mv.job_id}:{o.nonce}:start"
            out.append(
                Outgoing(
                    self.subjects.cmd(o.dst_node),
                    Command(
                        id=cid,
                        cmd_id=cid,
                        kind="migrate_start",
                        node=o.dst_node,
                        gpu_id=mv.dst_gpu,
                        gpu_index=o.dst_gpu_view.index,
                        ops=plan.ops,
                        instance_id=plan.instance_id,
                        src_instance_id=mv.src_instance,
                        job_id=mv.job_id,
                        workload=o.job.workload,
                        duration_s=o.job.duration_hint_s,
                        at=now,
                        submitted_at=o.job.submitted_at,
                    ),
                    d.ctx,
                )
            )
            d.span.set_attribute("migsched.move", mv.reason[:500])
        await self.bus.publish_batch(out)
        m.child(m.COMMANDS, "migrate_start", "sent").inc(len(out))

    async def _move_over(self, d: Delivery, o: MigrateOrder, plan: PartitionPlan, now: float) -> list[Outgoing]:
        """A move whose job ended or was re-queued since the planner reserved it: no target is made. A target a
        release kept retiring for a stop on that node is dropped (the node never made it, or the stop's
        confirmation would idle an instance it lacks). The idle instances in the target's way left the state
        with the reserve. A release gives them back ``retiring`` and the registry destroys them (``given_back``):
        nothing to send. A re-queue by the node registry (a lost or re-registered source node) does not: the
        node destroys them here, as the move's first ops would have (a ``destroy_idle`` of those ops only; no
        state to change)."""
        mv = o.move
        b = self.state.batch()
        b.migrate_finish(
            "abort", mv.job_id, "move over before it started", now, "idle", o.dst_node, f":{mv.job_id}.{o.nonce}"
        )
        await b.run()
        clear = tuple(op for op in plan.ops if op.kind in ("destroy_ci", "destroy_gi"))
        if not clear:
            return []
        cleared = {op.instance_id for op in clear}
        (g,) = await self.state.get_gpus([mv.dst_gpu])
        if g is not None and any(i.id in cleared for i in g.instances):
            # given back by the release: a second destroy could find a newer instance at the same place
            return []
        cid = f"mig:{mv.job_id}:{o.nonce}:clear"
        cmd = Command(
            id=cid,
            cmd_id=cid,
            kind="destroy_idle",
            node=o.dst_node,
            gpu_id=mv.dst_gpu,
            gpu_index=o.dst_gpu_view.index,
            ops=clear,
            at=now,
        )
        return [Outgoing(self.subjects.cmd(o.dst_node), cmd, d.ctx)]

    async def prepare(self) -> None:
        # Retention runs where the exit report is released (``reports``), not from jobs.exit: a consumer left
        # by an older version would only pile up messages nobody acks.
        await self.retire_consumer(self.subjects.stream_jobs, "partitioner-exit")
        # the balancer sends every place command: an older version's sched.placed consumer has nothing to do
        await self.retire_consumer(self.subjects.stream_sched, "partitioner-placed")

    # --- after a job exit: keep or destroy the idle instance ------------------------------------------------
    async def retain_or_destroy(self, freed: list[tuple[StoredGpu, str, Any]]) -> None:
        """``freed``: (the GPU after the release, the instance the job left, its span)."""
        now = time.time()
        retire = self.state.batch()
        planned: list[tuple[Any, Any, str]] = []
        counts = self.demand.counts(now)
        for g, instance_id, span in freed:
            inst = next((i for i in g.instances if i.id == instance_id), None)
            if inst is None or inst.state != "idle":
                continue  # already reused, retired or gone
            same = sum(
                1 for i in g.instances if i.state == "idle" and i.profile == inst.profile and i.id != inst.id
            )
            verdict = keep_idle(inst.profile, counts, same, self.retention)
            span.set_attribute("migsched.retention", verdict.reason)
            if verdict.keep:
                continue
            retire.instance("retire", g.node, g.id, inst.id, now)
            planned.append((g, inst, verdict.reason))
        if not planned:
            return
        out: list[Outgoing] = []
        for (g, inst, why), status in zip(planned, await retire.run(), strict=True):
            if status != "ok":
                continue
            out.append(Outgoing(self.subjects.cmd(g.node), self.destroy_command(g, inst, now)))
            self.log.debug("destroying idle %s: %s", inst.id, why)
        await self.bus.publish_batch(out)
        m.child(m.COMMANDS, "destroy_idle", "sent").inc(len(out))

    def destroy_command(self, g: Any, inst: Any, now: float) -> Command:
        from shared.policy.partition import MigOp

        model = self.geometry.model(g.model)
        pid = model.profile(inst.profile).profile_id if model.has_profile(inst.profile) else 0
        ops = tuple(
            MigOp(
                kind=k,
                gpu_id=g.id,
                instance_id=inst.id,
                profile=inst.profile,
                profile_id=pid,
                start=inst.start,
                size=inst.size,
            )
            for k in ("destroy_ci", "destroy_gi")
        )
        m.child(m.RECONFIGURATIONS, "destroy_gi").inc()
        cid = f"destroy:{inst.id}"[:200]
        return Command(
            id=cid,
            cmd_id=cid,
            kind="destroy_idle",
            node=g.node,
            gpu_id=g.id,
            gpu_index=g.index,
            ops=ops,
            instance_id=inst.id,
            at=now,
        )

    # --- jobs.cancel ----------------------------------------------------------------------------------------
    async def on_cancel(self, ds: list[Delivery]) -> None:
        now = time.time()
        b = self.state.batch()
        for d in ds:
            b.cancel(d.data.job_id, d.data.reason or "cancelled by request", now)
        out: list[Outgoing] = []
        for d, res in zip(ds, await b.run(), strict=True):
            if res.status == "stop" and res.node:
                cid = f"stop:{d.data.job_id}"
                out.append(
                    Outgoing(
                        self.subjects.cmd(res.node),
                        Command(
                            id=cid,
                            cmd_id=cid,
                            kind="stop",
                            node=res.node,
                            gpu_id=res.gpu_id or None,
                            instance_id=res.instance_id or None,
                            job_id=d.data.job_id,
                            at=now,
                        ),
                        d.ctx,
                    )
                )
        await self.bus.publish_batch(out)
        m.child(m.COMMANDS, "stop", "sent").inc(len(out))
