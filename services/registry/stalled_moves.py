"""Moves whose target copy runs but which never completed: a report or a ``migrate_stop`` a consumer skipped.

A move runs make-before-break: the target node's ``migrate_start`` starts the job's copy there, its ``cmd_done``
has the registry send ``migrate_stop`` to the source node, and that command's ``cmd_done`` commits the move
(``reports``). A replicated consumer of a nats-server before 2.11 can skip any of these three messages
(``shared.bus.server_version``), which leaves the job ``migrating``, its target reserved, until it exits.

Each heartbeat names the command that started each run (``listed_runs``, whose look this judges). A job still
migrating whose move's target node lists it as started by that move's ``migrate_start``, at one sweep and again a
command time-out later, gets its ``migrate_stop`` again under a new id, at most once per time-out. That command is
idempotent at the executor (it stops the source copy where that still runs, and answers either way), and its answer
commits the move.

A move whose ``sched.migrate`` order or ``migrate_start`` was skipped is not resumed: nothing tells whether that
command is still on its way, and a start applied after an abort would leave the job running where the state
does not know it.
"""

from __future__ import annotations

import time

from services.common.service import Context
from services.registry import metrics as m
from services.registry.listed_runs import ListedRun, Look, Overdue
from services.registry.moves import move_target_tail, source_stop
from shared.bus import Outgoing
from shared.state.model import JobRecord


def stalled(rec: JobRecord, run: ListedRun) -> bool:
    """Whether ``run`` is the target copy of the move ``rec`` is still migrating by."""
    if rec.state != "migrating" or not rec.mig_gpu:
        return False
    tail = move_target_tail(run.started_by, run.job)
    return bool(tail) and rec.mig_inst.endswith(tail) and run.node == rec.mig_gpu.rpartition("/")[0]


class StalledMoves:
    def __init__(self, ctx: Context, grace_s: float) -> None:
        self.bus = ctx.bus
        self.log = ctx.log
        self.overdue = Overdue(grace_s)
        """Keyed by (node, job, the move's ``migrate_start`` id)."""

    async def sweep(self, look: Look) -> int:
        """Send again the ``migrate_stop`` of the moves stalled for a grace; how many went out."""
        out: list[Outgoing] = []
        for run in look.runs:
            rec = look.records.get(run.job)
            if rec is None or not stalled(rec, run):
                continue
            held = self.overdue.check((run.node, run.job, run.started_by), run.heard, look.now)
            if held is None:
                continue
            cid = f"{run.started_by.removesuffix(':start')}:stop:{int(time.time() * 1000)}"
            out.append(Outgoing(self.bus.subjects.cmd(rec.node), source_stop(rec, cid, time.time())))
            self.log.warning("the move of %s to %s has run on its target for %.0f s without completing: sending "
                             "its source's migrate_stop again", run.job, rec.mig_inst, held)
        self.overdue.settle()
        if out:
            await self.bus.publish_batch(out)
            m.MOVES_RESUMED.inc(len(out))
        return len(out)
