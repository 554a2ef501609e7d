"""``MemoryState``'s job transitions (mirror ``lua/enqueue.lua``, ``settle.lua``, ``release.lua`` (in
``memory_release``), ``mark_running.lua``, ``fail_placement.lua``, ``cancel.lua`` and ``expire.lua``): a job
queued, settled, leaving its instances, started, failed to place, cancelled, forgotten after its retention."""

from __future__ import annotations

from collections.abc import Iterable

from shared.state.codec import CancelResult
from shared.state.memory_prelude import _ACTIVE, MemoryPrelude, _Shard
from shared.state.memory_release import release
from shared.state.memory_slots import (
    hold_for_stop,
    hold_members,
    names,
    node_of,
    spans,
    vacate,
)
from shared.state.model import (
    TERMINAL_STATES,
    JobRecord,
    PlacementFailure,
    ReleaseResult,
    StoredInstance,
    prio_score,
)


class JobTransitions(MemoryPrelude):
    """The job transitions of ``MemoryState`` (``_t_<name>`` is what ``batch().<name>`` queues)."""

    def _t_enqueue(
        self, job: str, spec: bytes, prio: int, at: float, reason: str, now: float, traceparent: str = ""
    ) -> str:
        sh = self._js(job)
        j = sh.jobs.get(job)
        if j is not None:
            if j.state == "pending":
                j.reason = reason
            return j.state
        sh.jobs[job] = JobRecord(job_id=job, state="", spec=spec, prio=prio, at=at, traceparent=traceparent)
        sh.pending[job] = prio_score(prio, at)
        self._state(sh, job, "", "pending", reason, now)
        return "queued"

    def _t_settle(self, job: str, to: str, reason: str, now: float, from_states: Iterable[str],
                  spec: bytes = b"") -> str:
        sh = self._js(job)
        j = sh.jobs.get(job)
        st = j.state if j else "-"
        if st not in tuple(from_states):
            return "noop"
        sh.pending.pop(job, None)
        if j is None:
            sh.jobs[job] = JobRecord(job_id=job, state="", spec=spec)
        self._state(sh, job, "" if st == "-" else st, to, reason, now)
        return "ok"

    def _t_release(
        self, job: str, kind: str, reason: str, now: float, instance_id: str = "", node: str = "",
        attempt: int | None = None, report: str = "",
    ) -> ReleaseResult:
        return release(self, job, kind, reason, now, instance_id, node, attempt, report)

    def _t_mark_running(
        self,
        job: str,
        instance_id: str,
        now: float,
        cmd_id: str = "",
        attempt: int | None = None,
        node: str = "",
        found: StoredInstance | None = None,
    ) -> str:
        """As mark_running.lua, including a run the state no longer expects ('stop', ``_hold_late``)."""
        sh = self._js(job)
        if cmd_id:
            sh.cmds.pop(cmd_id, None)
        j = sh.jobs.get(job)
        if j is not None and attempt is not None and attempt < j.attempts:
            active = j.state in _ACTIVE
            if not instance_id:
                if not (active and (j.node == node or any(node_of(g) == node for g, _ in j.held()))):
                    return "stop"
            elif not (active and names(j, instance_id)):
                seen = sh.late.setdefault(job, set())  # the job hash's 'late' field in Redis
                if attempt not in seen:
                    self._hold_late(sh, job, node, instance_id, found)
                    seen.add(attempt)
                return "stop"
        if j is None or j.state != "placing":
            return "noop"
        across, waiting = spans(j.held()), False  # see mark_running.lua: a gang across nodes
        if instance_id and instance_id != j.inst and not (across and names(j, instance_id)):
            return "stale"
        held = []
        for gid, iid in j.held():
            _, g = self._gpu(gid)
            i = next((x for x in g.instances if x.id == iid), None) if g else None
            mine = i is not None and i.job == job
            if across and node_of(gid) != node:
                waiting = waiting or (mine and i is not None and i.state == "reserved")
                continue
            if g is None or i is None or not mine:
                return "gone"
            held.append((g, i))
        for g, i in held:
            i.state, i.started, i.created = "busy", now, False
            self._save(sh, g, bump=False)
        if attempt is not None and attempt < j.attempts:  # an earlier attempt's late run is this placement's
            sh.ra[job] = (j.attempts, attempt)
        if waiting:
            self._hist(sh, job, "placing", "placing", f"node {node} started its part of the gang", now)
            return "ok"
        self._state(sh, job, "placing", "running", "executor started the workload", now)
        return "ok"

    def _hold_late(
        self, sh: _Shard, job: str, node: str, iid: str, found: StoredInstance | None
    ) -> None:
        """As ``hold_late`` in mark_running.lua: the late run's instance stays taken until the node confirms."""
        if sh.nodes.get(node, {}).get("state") != "up" or ":" not in iid:
            return
        g = sh.gpus.get(iid.split(":", 1)[0])
        if g is None or g.node != node or not g.mig:
            return
        i = next((x for x in g.instances if x.id == iid), None)
        if i is not None:
            if i.job or i.state not in ("idle", "retiring"):
                return
            hold_for_stop(i, job)
        else:
            if found is None:
                return
            new = StoredInstance(
                id=iid, profile=found.profile, start=found.start, size=found.size, compute=found.compute
            )
            if any(x.mask & new.mask for x in g.instances):
                return
            hold_for_stop(new, job)
            g.instances.append(new)
        self._save(sh, g, "claim")

    def _t_fail_placement(
        self,
        job: str,
        reason: str,
        now: float,
        max_attempts: int,
        cmd_id: str = "",
        attempt: int | None = None,
    ) -> PlacementFailure:
        sh = self._js(job)
        if cmd_id:
            sh.cmds.pop(cmd_id, None)
        j = sh.jobs.get(job)
        if j is None or j.state != "placing":
            return PlacementFailure("noop", j.state if j else "", "")
        if attempt is not None and attempt < j.attempts:  # an older command: not the current placement's
            return PlacementFailure("noop", j.state, "")
        gpu_id = ",".join(gid for gid, _ in j.held())  # a gang frees several GPUs
        stops: list[tuple[str, str, str]] = []
        if spans(j.held()):  # see fail_placement.lua: the members that started keep their part until stopped
            started = set()
            for gid, iid in j.held():
                _, g = self._gpu(gid)
                if g is not None and any(x.id == iid and x.job == job and x.state == "busy" for x in g.instances):
                    started.add(node_of(gid))
            keep = [(gid, iid) for gid, iid in j.held() if node_of(gid) in started]
            if keep:
                stops = hold_members(self, sh, job, keep, "")
        for gid, iid in j.held():
            _, g = self._gpu(gid)
            if g is not None:
                if any(x.id == iid and x.state == "retiring" for x in g.instances):
                    continue
                vacate(g.instances, iid, job, True)
                self._save(sh, g)
        if j.attempts + 1 >= max_attempts:
            j.attempts += 1
            self._state(sh, job, "placing", "failed", reason, now)
            return PlacementFailure("ok", "failed", gpu_id, tuple(stops))
        self._requeue(sh, job, "placing", reason, now)
        return PlacementFailure("ok", "pending", gpu_id, tuple(stops))

    def _t_cancel(self, job: str, reason: str, now: float) -> CancelResult:
        sh = self._js(job)
        j = sh.jobs.get(job)
        if j is None:
            sh.jobs[job] = JobRecord(job_id=job, state="")
            self._state(sh, job, "", "cancelled", reason, now)
            return CancelResult(status="cancelled")
        if j.state == "pending":
            sh.pending.pop(job, None)
            self._state(sh, job, "pending", "cancelled", reason, now)
            return CancelResult(status="cancelled")
        if j.state in _ACTIVE:
            j.cancel = True
            self._hist(sh, job, j.state, j.state, "cancel requested: " + reason, now)
            return CancelResult(status="stop", node=j.node, gpu_id=j.gpu, instance_id=j.inst)
        return CancelResult(status="noop", state=j.state)

    def _t_expire(self, shard: int, before: float, limit: int, cap: int = 0, settled: float = 0.0) -> int:
        """As expire.lua: at most ``limit`` ended jobs, the oldest first (ties by id, as a Redis zset orders
        them), are forgotten: those that ended before ``before`` and, while more than ``cap`` (> 0) are listed,
        the oldest beyond the cap that ended before ``settled``; a ``done`` entry whose job is not terminal only
        leaves it."""
        sh = self._s[shard]
        ended = sorted((t, j) for j, t in sh.done.items())
        due = sum(1 for t, _ in ended if t < before)
        over = len(ended) - cap if cap > 0 else 0
        beyond_cap = sum(1 for t, _ in ended[:over] if t < settled)  # a prefix: ``ended`` is in time order
        ids = ended[: min(limit, max(due, beyond_cap))]
        n = 0
        for _, job in ids:
            j = sh.jobs.get(job)
            if j is None or j.state in TERMINAL_STATES:
                sh.jobs.pop(job, None)
                sh.hist.pop(job, None)
                sh.late.pop(job, None)  # the job hash's 'late' field in Redis
                sh.ra.pop(job, None)
                sh.xid.pop(job, None)
                n += 1
            del sh.done[job]
        return n
