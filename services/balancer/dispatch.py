"""The balancer's commands: each committed placement becomes the executor's ``place`` command on ``cmd.<node>``.

The place commands are tracked in ``:cmds`` already: each reservation recorded its command in the same transition
(``Reservation.track``). A placement no command can be planned for (the compare-and-set on the same view rules
that out) is given back: the job is queued again, or fails after ``MIGSCHED_MAX_ATTEMPTS``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from services.balancer.candidate import Candidate
from services.balancer.preempting import wire_priority
from services.common import metrics as m
from services.common.place_command import place_cmd_id, place_commands, victim_stops
from shared.bus import Outgoing
from shared.events import JobInfo, Placed, Subjects, wire_gpu
from shared.mig.geometry import Geometry
from shared.policy.placement.decision import Placement
from shared.policy.preemption import Victim
from shared.ports import EventBus, StateStore


class Dispatcher:
    def __init__(self, bus: EventBus, state: StateStore, geometry: Geometry, max_attempts: int,
                 requeued: Callable[[], None], log: logging.Logger) -> None:
        self.bus = bus
        self.state = state
        self.geometry = geometry
        self.max_attempts = max_attempts
        self.requeued = requeued
        self.log = log
        self.subjects: Subjects = bus.subjects

    @staticmethod
    def placed(c: Candidate, dec: Placement, gpu_before: Any, ver: int, now: float) -> Placed:
        sub = c.submit
        return Placed(
            id=f"placed:{sub.job_id}:{c.attempt}",
            job_id=sub.job_id,
            placement=dec,
            gpu=wire_gpu(gpu_before),
            gpu_version=ver,
            attempt=c.attempt,
            decided_at=now,
            job=JobInfo(
                tenant=sub.tenant,
                priority=wire_priority(c.priority),
                latency_sensitive=sub.latency_sensitive,
                migratable=sub.migratable,
                duration_hint_s=sub.duration_hint_s,
                workload=sub.workload,
                submitted_at=sub.submitted_at,
            ),
        )

    def commands(self, placed: Placed, c: Candidate, now: float, master_addr: str = "",
                 views: Mapping[str, Any] | None = None) -> list[Outgoing] | None:
        """The executors' ``place`` commands for a committed placement (one per member node of a gang across
        nodes; ``views``: a MIG gang's GPUs as planned from); None for one that cannot be planned."""
        cmds = place_commands(placed, self.geometry, now, master_addr, views)
        if not isinstance(cmds, list):
            self.log.error("placement of %s cannot be planned: %s", placed.job_id, cmds.reason)
            return None
        for cmd in cmds:
            m.count_reconfigurations(cmd.ops)
        if c.delivery is not None:
            c.delivery.span.set_attribute("migsched.ops", sum(len(cmd.ops) for cmd in cmds))
        return [Outgoing(self.subjects.cmd(cmd.node), cmd, c.ctx) for cmd in cmds]

    def victim_stops(self, placed: Placed, victims: Sequence[Victim], c: Candidate, now: float) -> list[Outgoing]:
        """Stops of preempted gangs' parts on nodes outside the placement (``victim_stops``)."""
        cmds = victim_stops(placed, [(v.job_id, v.gpu_ids, v.instance_ids) for v in victims], now)
        return [Outgoing(self.subjects.cmd(cmd.node), cmd, c.ctx) for cmd in cmds]

    async def give_back(self, placed: list[Placed]) -> None:
        """Fail the placements no command could be planned for, by their command ids (the reservation tracked
        them): each job is queued again, or fails after ``max_attempts``."""
        if not placed:
            return
        now = time.time()
        for p in placed:
            cid = place_cmd_id(p.job_id, p.attempt)
            await self.state.fail_placement(p.job_id, "partition plan conflict", now, self.max_attempts, cid,
                                            p.attempt)
        self.requeued()

    async def send(self, out: list[Outgoing]) -> None:
        await self.bus.publish_batch(out)
