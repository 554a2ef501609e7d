"""Migration orders (``sched.migrate``) become commands: ``migrate_start`` on the target node (make before break);
its confirmation sends ``migrate_stop`` for the source, whose confirmation commits the move (``reports``).

A move whose plan no longer fits the target, or whose job stopped migrating since the planner reserved it, is
aborted instead, and nothing is made on the target.
"""

from __future__ import annotations

import time

from services.common import metrics as m
from services.common.service import Context
from shared.bus import Delivery, Outgoing
from shared.events import Command, MigrateOrder
from shared.policy.partition import PartitionPlan, plan_partition
from shared.policy.placement.decision import Slot
from shared.state.model import JobRecord


class Moves:
    def __init__(self, ctx: Context) -> None:
        self.state = ctx.state
        self.bus = ctx.bus
        self.subjects = ctx.bus.subjects
        self.geometry = ctx.geometry
        self.log = ctx.log

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


def source_stop(job: JobRecord, cid: str, now: float) -> Command:
    """The ``migrate_stop`` of a migrating job's source copy, once its target copy started: the executor stops
    the copy on the source instance where it still runs, and answers either way; its answer commits the move."""
    gi = int(job.gpu.rsplit("/", 1)[1]) if "/" in job.gpu else None
    return Command(
        id=cid,
        cmd_id=cid,
        kind="migrate_stop",
        node=job.node,
        gpu_id=job.gpu,
        gpu_index=gi,
        instance_id=job.mig_inst,
        src_instance_id=job.inst,
        job_id=job.job_id,
        at=now,
    )


def move_target_tail(cmd_id: str, job_id: str) -> str:
    """The tail ``:<job>.<nonce>`` of a move's target instance id (``new_instance_id(.., f"{job}.{nonce}")``)
    from its ``migrate_start`` command id (``mig:<job>:<nonce>:start``); '' for any other id."""
    head = f"mig:{job_id}:"
    if not (cmd_id.startswith(head) and cmd_id.endswith(":start")):
        return ""
    nonce = cmd_id[len(head) : -len(":start")]
    return f":{job_id}.{nonce}" if nonce else ""
