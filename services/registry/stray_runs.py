"""Runs a node goes on reporting after their stop: a ``stop`` command the CMD stream's consumer skipped.

A replicated consumer of a nats-server before 2.11 can skip a message when its leader changes
(``shared.bus.server_version``). A skipped ``stop`` leaves a job running on its node for as long as its workload
lasts. Each heartbeat lists the jobs its node runs, and the command that started each run; the registry keeps the
last list per node (``listed_runs``), and at each sweep looks the listed jobs up. A run is *stray* when:

- its job has ended, its record is gone, or it is flagged for cancelling: no run of it is wanted anywhere;
- its job is queued again (preempted, or its placement failed), or runs on other nodes only, and the node named
  the command that started the run: that run is not the job's placement.

A run seen stray at one sweep, and still listed (started by the same command) by a heartbeat received at least
``grace_s`` later (the command time-out: a stop that arrived has acted long before), gets a new ``stop`` under a
new id (the stream would drop a repeat of the old one as a duplicate), at most once per grace. A stop for a run
of a job that may still be wanted names that run's command (``src_cmd_id``): the executor then ends that run
only, never one a later placement starts on the same node. A run whose command the node cannot name (an older
executor) is judged only when no run of its job is wanted.
"""

from __future__ import annotations

import time

from services.common.service import Context
from services.common.stop_command import stop_command
from services.registry import metrics as m
from services.registry.listed_runs import Look, Overdue
from shared.bus import Outgoing
from shared.state.model import ACTIVE_STATES, TERMINAL_STATES, JobRecord


def stray(rec: JobRecord | None) -> str | None:
    """Why a run of this job on any node should have been stopped; None when it may be wanted."""
    if rec is None:
        return "the state no longer holds the job"
    if rec.state in TERMINAL_STATES:
        return f"the job is {rec.state}"
    if rec.cancel:
        return "the job was cancelled"
    return None


def not_its_placement(rec: JobRecord, node: str) -> str | None:
    """Why a run of this wanted job on ``node`` is not its placement's; None when it may be."""
    if rec.state == "pending":
        return "the job is queued again"
    if rec.state in ACTIVE_STATES and node not in (nodes := rec.nodes()):
        return f"the job is {rec.state} on {', '.join(sorted(nodes))}"
    return None


class StrayRuns:
    def __init__(self, ctx: Context, grace_s: float) -> None:
        self.bus = ctx.bus
        self.log = ctx.log
        self.overdue = Overdue(grace_s)
        """Keyed by (node, job, the command that started the run or '')."""

    async def sweep(self, look: Look) -> int:
        """Stop again the runs stray for a grace; how many stops went out."""
        out: list[Outgoing] = []
        for node, job, by, heard in look.runs:
            rec = look.records.get(job)
            why = stray(rec)
            if why is not None:
                by = ""  # no run of it is wanted: any run of it on the node ends
            elif rec is not None and by:
                why = not_its_placement(rec, node)
            if why is None:
                continue
            held = self.overdue.check((node, job, by), heard, look.now)
            if held is None:
                continue
            cid = f"stop:{job}:stray:{node}:{int(time.time() * 1000)}"
            gpu = rec.gpu if rec is not None and rec.gpu.startswith(f"{node}/") else None
            out.append(Outgoing(self.bus.subjects.cmd(node), stop_command(
                node, job, cid, gpu, None, time.time(), only_that_run=False, started_by=by or None)))
            self.log.warning("node %s still runs %s%s %.0f s after its stop was due (%s): stopping it again",
                             node, job, f" (started by {by})" if by else "", held, why)
        self.overdue.settle()
        if out:
            await self.bus.publish_batch(out)
            m.STRAY_STOPS.inc(len(out))
        return len(out)
