"""Runs a node goes on reporting after their stop: a ``stop`` command the CMD stream's consumer skipped.

A replicated consumer of a nats-server before 2.11 can skip a message when its leader changes
(``shared.bus.server_version``). A skipped ``stop`` leaves a job running on its node for as long as its workload
lasts. Each heartbeat lists the jobs its node runs, and the command that started each run, so the registry keeps
the last list per node, and at each sweep looks the listed jobs up. A run is *stray* when:

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
from collections.abc import Callable
from typing import NamedTuple

from services.common.service import Context
from services.common.stop_command import stop_command
from services.registry import metrics as m
from shared.bus import Delivery, Outgoing
from shared.state.model import ACTIVE_STATES, TERMINAL_STATES, JobRecord

CHECK_MAX = 50_000
"""Runs looked up at one sweep, at most (the nodes' lists are bounded by the heartbeat schema)."""


class _Listed(NamedTuple):
    heard: float
    """When the heartbeat that listed these runs was received (``clock``)."""
    running: tuple[str, ...]
    started: dict[str, str]
    """Of ``running``, the command that started each run, where the node named it."""


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
    def __init__(self, ctx: Context, clock: Callable[[], float] = time.monotonic) -> None:
        self.state = ctx.state
        self.bus = ctx.bus
        self.log = ctx.log
        self.clock = clock
        self.grace_s = ctx.settings.cmd_timeout_s
        self._listed: dict[str, _Listed] = {}
        self._seen: dict[tuple[str, str, str], float] = {}
        """(node, job, the command that started the run or '') -> when the run was first judged stray, or last
        stopped again."""

    def on_heartbeat(self, ds: list[Delivery]) -> None:
        now = self.clock()
        for d in ds:
            hb = d.data
            self._listed[hb.node] = _Listed(now, tuple(hb.running), {r.job_id: r.cmd_id for r in hb.started})

    async def sweep(self) -> int:
        """Stop again the runs stray for a grace; how many stops went out."""
        now = self.clock()
        # a node silent that long is lost or gone: what it ran is its resync's to stop
        self._listed = {n: lst for n, lst in self._listed.items() if now - lst.heard < 2 * self.grace_s}
        pairs = [(node, job) for node, lst in self._listed.items() for job in lst.running][:CHECK_MAX]
        jobs = sorted({job for _, job in pairs})
        records = dict(zip(jobs, await self.state.jobs(jobs), strict=True)) if jobs else {}
        seen: dict[tuple[str, str, str], float] = {}
        out: list[Outgoing] = []
        for node, job in pairs:
            rec = records.get(job)
            by = self._listed[node].started.get(job, "")
            why = stray(rec)
            if why is not None:
                by = ""  # no run of it is wanted: any run of it on the node ends
            elif rec is not None and by:
                why = not_its_placement(rec, node)
            if why is None:
                continue
            key = (node, job, by)
            first = self._seen.get(key)
            if first is None or self._listed[node].heard - first < self.grace_s:
                seen[key] = now if first is None else first
                continue
            seen[key] = now
            cid = f"stop:{job}:stray:{node}:{int(time.time() * 1000)}"
            gpu = rec.gpu if rec is not None and rec.gpu.startswith(f"{node}/") else None
            out.append(Outgoing(self.bus.subjects.cmd(node), stop_command(
                node, job, cid, gpu, None, time.time(), only_that_run=False, started_by=by or None)))
            self.log.warning("node %s still runs %s%s %.0f s after its stop was due (%s): stopping it again",
                             node, job, f" (started by {by})" if by else "", self._listed[node].heard - first, why)
        self._seen = seen
        if out:
            await self.bus.publish_batch(out)
            m.STRAY_STOPS.inc(len(out))
        return len(out)
