"""Idle instances after a job exit: keep one for reuse or destroy it (``shared.policy.retention``).

Done where the release is (``reports``), not from ``jobs.exit``: one consumed message per job less. A crash
between that publish and this decision leaves the instance idle (reusable, and reclaimable by any placement that
needs its slices), never lost. A move that ended without taking gives back the idle instances it had removed
from its target's way, held ``retiring``: each gets a ``destroy_idle``.
"""

from __future__ import annotations

import time
from typing import Any

from services.common import metrics as m
from services.common.service import Context
from shared.bus import Outgoing
from shared.events import Command
from shared.policy.partition import MigOp
from shared.policy.retention import RecentDemand, RetentionParams, keep_idle
from shared.state import StoredGpu


class IdleInstances:
    def __init__(self, ctx: Context) -> None:
        st = ctx.settings
        self.state = ctx.state
        self.bus = ctx.bus
        self.subjects = ctx.bus.subjects
        self.geometry = ctx.geometry
        self.log = ctx.log
        self.retention = RetentionParams(window_s=st.retention_window_s, min_share=st.retention_min_share)
        self.demand = RecentDemand(st.retention_window_s)

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

    def destroy_command(self, g: Any, inst: Any, now: float) -> Command:
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

    async def destroy_given_back(self, detail: str, now: float) -> list[Outgoing]:
        """A ``destroy_idle`` for each idle instance a move that ended without taking (aborted, or its job
        released during it) gave back ``retiring`` (``gpu|id,id``)."""
        gpu_id, _, ids = detail.partition("|")
        (g,) = await self.state.get_gpus([gpu_id])
        if g is None:
            return []
        want = set(ids.split(","))
        out = [
            Outgoing(self.subjects.cmd(g.node), self.destroy_command(g, i, now))
            for i in g.instances
            if i.id in want and i.state == "retiring" and not i.job
        ]
        return out
