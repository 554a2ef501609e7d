"""The node registry: the state's record of every node, and the executor commands that follow what nodes report.

The balancer sends each placement's ``place`` command itself (``services.common.place_command``), and its
reservation tracks the command in Redis (``{ns:s}:cmds``) until the executor reports. This service is a
composition of named parts, each in its module:

- ``Nodes``: registrations, heartbeats, liveness, and commands without a result in time (``node.*.heartbeat``,
  ``registered`` reports);
- ``Reports``: command results and job exits turned into transitions (``node.*.report``), then ``jobs.exit``;
- ``MissedExits``: the exit reports a heartbeat repeats that ``Reports`` never received, applied all the same;
- ``ListedRuns``: what each node's last heartbeat said it runs, and which command started each run;
- ``StrayRuns``: runs a heartbeat still lists a command time-out after their job ended, was cancelled, was
  queued again or was placed on other nodes, stopped again;
- ``StalledMoves``: moves whose target copy runs a command time-out without the move completing, given their
  source's ``migrate_stop`` again;
- ``IdleInstances``: after an exit, keep the instance for reuse or destroy it;
- ``Moves``: migration orders (``sched.migrate``) to ``migrate_start`` / ``migrate_stop`` commands;
- ``Cancels``: ``jobs.cancel`` to the cancel transition, and a ``stop`` command for an active job (cancels the
  consumer skipped when its leader changed are read back and applied);
- ``Expiry``: jobs ended long ago deleted from Redis, so the state does not grow with every job ever submitted.

Durable consumer names keep the service's former name (``partitioner-migrate``, ``partitioner-cancel``): a
renamed durable would start empty and strand what the old one still held.
"""

from __future__ import annotations

from typing import Any

from services.common.read_back import LEAD_POLL_S
from services.common.service import Service
from services.registry.cancels import Cancels
from services.registry.expiry import EXPIRE_EVERY_S, Expiry
from services.registry.idle import IdleInstances
from services.registry.listed_runs import ListedRuns
from services.registry.missed_exits import MissedExits
from services.registry.moves import Moves
from services.registry.nodes import Nodes
from services.registry.reports import Reports
from services.registry.stalled_moves import StalledMoves
from services.registry.stray_runs import StrayRuns
from shared.bus import Consumer, Delivery
from shared.settings import RegistrySettings


class NodeRegistry(Service):
    name = "registry"
    settings: RegistrySettings

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        ctx = self.context()
        self.nodes = Nodes(ctx)
        self.idle = IdleInstances(ctx)
        self.reports = Reports(ctx, self.idle, self.nodes.on_registered)
        self.missed = MissedExits(ctx, self.reports)
        self.listed = ListedRuns(self.settings.cmd_timeout_s)
        self.stray = StrayRuns(ctx, self.listed.grace_s)
        self.stalled = StalledMoves(ctx, self.listed.grace_s)
        self.moves = Moves(ctx)
        self.cancels = Cancels(ctx)
        self.expiry = Expiry(ctx)

    def consumers(self) -> list[Consumer]:
        s, b = self.subjects, self.bus
        slow = self.settings.off_path_linger_s  # what nodes report: off the submit -> command path
        return [
            b.consumer(s.stream_sched, "partitioner-migrate", s.sched_migrate, self.moves.on_migrate),
            b.consumer(s.stream_jobs, "partitioner-cancel", s.jobs_cancel, self.cancels.on_cancel),
            b.consumer(s.stream_node, "registry-report", s.node_reports, self.reports.on_report, linger_s=slow),
            b.consumer(s.stream_node, "registry-heartbeat", s.node_heartbeats, self.on_heartbeat,
                       linger_s=slow, traced=False),
        ]

    async def on_heartbeat(self, ds: list[Delivery]) -> None:
        await self.nodes.on_heartbeat(ds)
        await self.missed.on_heartbeat(ds)
        self.listed.on_heartbeat(ds)

    async def check_listed_runs(self) -> tuple[int, int]:
        """Hold what the nodes list against the state, in one read: the stops sent again, the moves resumed."""
        look = await self.listed.look(self.state)
        return await self.stray.sweep(look), await self.stalled.sweep(look)

    def periodic(self) -> list[tuple[str, float, Any]]:
        st = self.settings
        sweeps = st.job_retention_s > 0 or st.job_retention_max > 0
        return [
            ("liveness", max(0.2, st.node_timeout_s / 5), self.nodes.check_liveness),
            ("command-timeouts", max(1.0, st.cmd_timeout_s / 4), self.nodes.sweep_commands),
            ("listed-runs", max(1.0, st.cmd_timeout_s / 4), self.check_listed_runs),
            # a consumer of one copy has no leader to lose (``services.common.read_back``)
            *([("missed-cancels", LEAD_POLL_S, self.cancels.apply_skipped)] if st.stream_replicas > 1 else []),
            *([("expire-jobs", EXPIRE_EVERY_S, self.expiry.expire_jobs)] if sweeps else []),
        ]

    async def prepare(self) -> None:
        # Retention runs where the exit report is released (``reports``), not from jobs.exit: a consumer left
        # by an older version would only pile up messages nobody acks.
        await self.retire_consumer(self.subjects.stream_jobs, "partitioner-exit")
        # the balancer sends every place command: an older version's sched.placed consumer has nothing to do
        await self.retire_consumer(self.subjects.stream_sched, "partitioner-placed")
