"""``MemoryState``'s reservation (mirrors ``lua/reserve.lua``): one or more slots (a MIG instance, a whole non-MIG
GPU, a time-sliced share) taken all or nothing, with the preemption of victims in the same step.

An attempt works on copies of the GPUs it touches and writes them back only once every check has passed, so a
refused reservation leaves nothing behind, as the Lua script's read-everything-then-write order does."""

from __future__ import annotations

import copy
from typing import Any

import msgspec

from shared.state import usage
from shared.state.memory_slots import names, vacate
from shared.state.model import (
    PLAIN_PROFILES,
    JobRecord,
    Reservation,
    ReserveResult,
    SlotReservation,
    StoredGpu,
    StoredInstance,
    prio_score,
)

Refusal = tuple[str, str]
"""(status, detail) of a slot that cannot be taken."""


def reserve(store: Any, r: Reservation, now: float) -> ReserveResult:
    """Take every slot of ``r`` and preempt its victims, or nothing (the result says why)."""
    a = _Attempt(store, r)
    if a.job is not None and a.job.state != "pending":
        return a.out("known", 0, a.job.state)
    return a.check_slots() or a.take_victims() or a.put_slots() or a.check_quota() or a.commit(now)


class _Attempt:
    """One reservation in progress: the GPUs it touches, as copies (id -> stored GPU, its instances)."""

    def __init__(self, store: Any, r: Reservation) -> None:
        self.store, self.r = store, r
        self.sh = store._js(r.job_id)
        self.job: JobRecord | None = self.sh.jobs.get(r.job_id)
        self.slots = r.all_slots()
        self.work: dict[str, tuple[StoredGpu, list[StoredInstance]]] = {}
        self.claimed: set[str] = set()
        self.first: StoredGpu | None = None
        self.new_ids: list[tuple[str, str]] = []

    def out(self, status: str, ver: int | None = None, detail: str = "") -> ReserveResult:
        """The result; ``ver`` defaults to the first slot's GPU's version."""
        if ver is None:
            ver = self.first.ver if self.first is not None else 0
        return ReserveResult(status=status, job_id=self.r.job_id, gpu_id=self.r.gpu_id, ver=ver, detail=detail)

    def load(self, gid: str) -> tuple[StoredGpu, list[StoredInstance]] | None:
        if gid not in self.work:
            _, g = self.store._gpu(gid)
            if g is None:
                return None
            self.work[gid] = (g, copy.deepcopy(g.instances))
        return self.work[gid]

    def check_slots(self) -> ReserveResult | None:
        """Every slot's GPU exists at the version the plan read, is healthy, and (unless the job spans nodes)
        on the first slot's node."""
        for s in self.slots:
            got = self.load(s.gpu_id)
            if got is None:
                return self.out("nogpu", 0, s.gpu_id)
            g = got[0]
            first = self.first = self.first or g
            if g.ver != s.expected_ver:
                return self.out("conflict", detail=f"{s.gpu_id} version {g.ver}")
            if not g.healthy:
                return self.out("unhealthy", detail=s.gpu_id)
            if g.node != first.node and not self.r.span:
                return self.out("node", detail=f"{s.gpu_id} is on another node")
            self.claimed.add(s.gpu_id)
        return None

    def take_victims(self) -> ReserveResult | None:
        """Every victim still runs where the plan saw it, preemptible; its instances are vacated in the copies."""
        for v in self.r.victims:
            vj = self.sh.jobs.get(v.job_id)
            if vj is None or vj.state != "running" or not names(vj, v.instance_id):
                state = vj.state if vj else "unknown"
                return self.out("victim", detail=f"{v.job_id} is {state} on {(vj.gpu if vj else '') or '-'}")
            for gid, iid in vj.held():
                got = self.load(gid)
                vi = next((x for x in got[1] if x.id == iid), None) if got else None
                if got is None or vi is None or vi.job != v.job_id or not vi.pre:
                    return self.out("victim", detail=iid)
                vacate(got[1], iid, v.job_id, False)
        return None

    def put_slots(self) -> ReserveResult | None:
        """Each slot's instance, reserved for the job in the copies."""
        for s in self.slots:
            g, insts = self.work[s.gpu_id]
            new = copy.deepcopy(s.instance)
            refused = _put(s, g, insts, new, self.r.job_id)
            if refused is not None:
                return self.out(refused[0], detail=refused[1])
            self.new_ids.append((s.gpu_id, new.id))
        return None

    def check_quota(self) -> ReserveResult | None:
        over = over_quota(self.sh, self.r)
        return None if over is None else self.out("quota", detail=over)

    def commit(self, now: float) -> ReserveResult:
        """Every check passed: the victims go back to the queue, the copies are written, the job is placing."""
        r, sh, store = self.r, self.sh, self.store
        assert self.first is not None
        for v in r.victims:
            _requeue(store, sh, v.job_id, v.reason, now)
        ver = 0
        for n, (gid, (g, insts)) in enumerate(self.work.items()):
            g.instances = insts
            saved = store._save(sh, g, "claim" if gid in self.claimed else True)
            if n == 0:
                ver = saved
        j = self._placing(now)
        self._track(j.attempts, now)
        res = self.out("ok", ver, str(j.attempts))
        if len(self.slots) == 1:
            return res
        return msgspec.structs.replace(res, master_addr=sh.nodes.get(self.first.node, {}).get("addr", ""))

    def _placing(self, now: float) -> JobRecord:
        """The job's record, created for a first submit, now ``placing`` on its slots and charged."""
        r, sh, store = self.r, self.sh, self.store
        assert self.first is not None
        j, prev = self.job, ""
        if j is not None:
            prev = "pending"
            sh.pending.pop(r.job_id, None)
        else:
            j = sh.jobs[r.job_id] = JobRecord(
                job_id=r.job_id,
                state="",
                spec=r.spec,
                prio=r.prio,
                at=r.submitted_at,
                traceparent=r.traceparent,
            )
        j.gpu, j.inst, j.node = r.gpu_id, self.new_ids[0][1], self.first.node
        j.slots = tuple(self.new_ids) if len(self.new_ids) > 1 else ()
        if r.tenant:
            store._charge(sh, r.job_id, r.tenant, r.usage)
        else:  # as reserve.lua: no tenant's charge left from an earlier placement
            j.tenant, j.usage = "", {}
        store._state(sh, r.job_id, prev, "placing", r.reason, now)
        return j

    def _track(self, attempts: int, now: float) -> None:
        """The place commands the registry times out: one per member node for a gang across nodes
        (``place:<job>:<attempt>/<node rank>``), else one."""
        r, sh = self.r, self.sh
        if not r.track:
            return
        if not r.span:
            assert self.first is not None
            sh.cmds[f"place:{r.job_id}:{attempts}"] = {
                "node": self.first.node,
                "kind": "place",
                "job": r.job_id,
                "gpu": r.gpu_id,
                "at": now,
            }
            return
        members: dict[str, str] = {}
        for s in self.slots:
            members.setdefault(self.work[s.gpu_id][0].node, s.gpu_id)
        for k, (node, gid) in enumerate(members.items()):
            sh.cmds[f"place:{r.job_id}:{attempts}/{k}"] = {
                "node": node,
                "kind": "place",
                "job": r.job_id,
                "gpu": gid,
                "at": now,
            }


def _put(
    s: SlotReservation, g: StoredGpu, insts: list[StoredInstance], new: StoredInstance, job: str
) -> Refusal | None:
    """Reserve ``new`` (slot ``s``'s instance) for ``job`` in ``insts``, the copy of ``g``'s instances."""
    if new.profile in PLAIN_PROFILES:
        return _put_plain(s, g, insts, new, job)
    if not g.mig:
        return "mode", f"{s.gpu_id} is not in MIG mode"
    if s.action == "reuse":
        return _reuse(insts, new, job)
    return _create(s, insts, new, job)


def _put_plain(
    s: SlotReservation, g: StoredGpu, insts: list[StoredInstance], new: StoredInstance, job: str
) -> Refusal | None:
    """A whole non-MIG GPU or one time-sliced share of it."""
    if g.mig:
        return "mode", f"{s.gpu_id} is in MIG mode"
    for i in insts:
        if new.profile == "gpu" or i.profile == "gpu":
            return "busy", i.id
        if i.start == new.start:
            return "overlap", i.id
    if new.profile == "shared" and (new.start >= g.replicas or len(insts) >= g.replicas):
        return "count", f"{s.gpu_id} has {g.replicas} replicas"
    new.state, new.job, new.created = "reserved", job, True
    insts.append(new)
    return None


def _reuse(insts: list[StoredInstance], new: StoredInstance, job: str) -> Refusal | None:
    """An idle MIG instance taken as it is, with the new job's attributes."""
    reused = next((x for x in insts if x.id == new.id), None)
    if reused is None:
        return "gone", new.id
    if reused.state != "idle":
        return "busy", new.id
    reused.state, reused.job, reused.created = "reserved", job, False
    reused.prio, reused.ls, reused.mig, reused.tenant, reused.pre = new.prio, new.ls, new.mig, new.tenant, new.pre
    reused.ends = new.ends
    return None


def _create(s: SlotReservation, insts: list[StoredInstance], new: StoredInstance, job: str) -> Refusal | None:
    """A new MIG instance, after the idle ones the plan destroys for it."""
    for did in s.destroy:
        gone = next((x for x in insts if x.id == did), None)
        if gone is not None:
            if gone.state != "idle":
                return "busy", did
            insts.remove(gone)
    same = 0
    for i in insts:
        if i.mask & new.mask:
            return "overlap", i.id
        same += i.profile == new.profile
    if same >= s.max_count:
        return "count", new.profile
    new.state, new.job, new.created = "reserved", job, True
    insts.append(new)
    return None


def _requeue(store: Any, sh: Any, job_id: str, reason: str, now: float) -> None:
    """A preempted victim leaves its placement and is pending again."""
    vj = sh.jobs[job_id]
    vj.gpu = vj.inst = vj.node = vj.mig_gpu = vj.mig_inst = ""
    vj.slots = vj.mig_gone = ()
    vj.preempted += 1
    vj.attempts += 1
    sh.pending[job_id] = prio_score(vj.prio, vj.at)
    store._state(sh, job_id, "running", "pending", reason, now)


def over_quota(sh: Any, r: Reservation) -> str | None:
    """Why ``r`` would take its tenant past one of its ``limits`` in this shard (the victims' charges given back
    first), as ``lua/reserve.lua`` checks it; None when it would not."""
    if not r.tenant or not r.limits:
        return None
    freed: dict[str, float] = {}
    for v in r.victims:
        vj = sh.jobs.get(v.job_id)
        if vj is None or not vj.counted:
            continue
        for resource, amount in vj.usage.items():
            k = usage.field(vj.tenant, resource)
            freed[k] = freed.get(k, 0.0) + amount

    def used(tenant: str, resource: str) -> float:
        k = usage.field(tenant, resource)
        return float(sh.usage.get(k, 0.0) - freed.get(k, 0.0))

    for lim in r.limits:
        q = r.usage.get(lim.resource, 0.0)
        if q <= 0:
            continue
        new = used(r.tenant, lim.resource) + q
        if lim.cap is not None and new > lim.cap + 1e-9:
            return f"{r.tenant} would use {new:g} {lim.resource} in this shard; it may {lim.cap:g}"
        if lim.members and new > lim.nominal + 1e-9:
            c = q + sum(used(m, lim.resource) for m in lim.members)
            if c > lim.cohort_cap + 1e-9:
                return f"its cohort would use {c:g} {lim.resource} in this shard; it may {lim.cohort_cap:g}"
    return None
