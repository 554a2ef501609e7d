"""``MemoryState``'s slot transitions (mirrors ``lua/reserve.lua`` and the slot helpers of ``lua/prelude.lua``):
a reservation of one or more slots (a MIG instance, a whole non-MIG GPU, a time-sliced share), all or nothing,
with the preemption of victims in the same step; and how a job leaves its instances."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import msgspec

from shared.state import usage
from shared.state.model import (
    PLAIN_PROFILES,
    JobRecord,
    Reservation,
    ReserveResult,
    StoredGpu,
    StoredInstance,
    prio_score,
)


def idle(i: StoredInstance) -> None:
    """As ``idle`` in prelude.lua: the instance is kept for reuse, with no trace of its last job."""
    i.state, i.job, i.prio, i.ls, i.mig, i.tenant, i.started, i.created, i.pre, i.ends = (
        "idle",
        None,
        0,
        False,
        True,
        "",
        0.0,
        False,
        True,
        0.0,
    )


def hold_for_stop(i: StoredInstance, job: str) -> None:
    """As ``hold_for_stop`` in prelude.lua: a job runs on ``i`` although the state does not hold it there; the
    instance stays occupied (``retiring`` with the job) until the node confirms the job is gone
    (``memory_nodes.stopped``)."""
    idle(i)
    i.state, i.job = "retiring", job


def give_back(insts: list[StoredInstance], gone: Iterable[StoredInstance], state: str) -> list[str]:
    """The idle instances a move's reserve removed from its target's way, back in ``insts`` as ``state`` (idle,
    or retiring until a destroy settles them) unless they overlap an instance there now (``lua/migrate.lua``
    abort, ``lua/release.lua``); returns their ids."""
    back: list[str] = []
    for was in gone:
        if any(i.id == was.id or i.mask & was.mask for i in insts):
            continue
        r = copy.deepcopy(was)
        idle(r)
        r.state = state
        insts.append(r)
        back.append(r.id)
    return back


def vacate(insts: list[StoredInstance], instance_id: str, job: str, drop_created: bool) -> StoredInstance | None:
    """The job leaves ``instance_id``: a MIG instance idles (removed when ``drop_created`` and its own
    reservation created it), a plain one is removed. None when the instance is not the job's."""
    i = next((x for x in insts if x.id == instance_id), None)
    if i is None or i.job != job:
        return None
    if i.profile in PLAIN_PROFILES or (drop_created and i.created):
        insts.remove(i)
    else:
        idle(i)
    return i


def node_of(gpu_id: str) -> str:
    """The node of a GPU id ``<node>/<index>`` (``node_of`` in prelude.lua)."""
    return gpu_id.rpartition("/")[0]


def inst_node(instance_id: str) -> str:
    """The node of an instance id ``<gpu id>:...``."""
    return node_of(instance_id.partition(":")[0])


def job_nodes(job: JobRecord) -> set[str]:
    """The nodes a job's placement holds: its slots' and its move target's (``holds_on`` in prelude.lua)."""
    nodes = {node_of(g) for g, _ in job.held()}
    if job.node:
        nodes.add(job.node)
    if job.mig_gpu:
        nodes.add(node_of(job.mig_gpu))
    return nodes


def spans(slots: Iterable[tuple[str, str]]) -> bool:
    """Whether a job's slots lie on several nodes (a gang across nodes)."""
    return len({node_of(g) for g, _ in slots}) > 1


def hold_members(
    store: Any, sh: Any, job: str, slots: Iterable[tuple[str, str]], but: str
) -> list[tuple[str, str, str]]:
    """As ``hold_members`` in prelude.lua: a gang across nodes that must end keeps its instances on nodes other
    than ``but`` taken (retiring with the job) until each node confirms a stop; one (node, gpu, instance) per
    node to stop."""
    stops: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for gid, iid in slots:
        _, g = store._gpu(gid)
        i = next((x for x in g.instances if x.id == iid), None) if g else None
        if g is None or i is None or i.job != job or node_of(gid) == but:
            continue
        hold_for_stop(i, job)
        store._save(sh, g, "claim")
        if node_of(gid) not in seen:
            seen.add(node_of(gid))
            stops.append((node_of(gid), gid, iid))
    return stops


def names(j: JobRecord, instance_id: str) -> bool:
    """The job's record names the instance: one of its slots or its migration target."""
    return instance_id in (j.inst, j.mig_inst) or any(iid == instance_id for _, iid in j.slots)


def reserve(store: Any, r: Reservation, now: float) -> ReserveResult:
    sh = store._js(r.job_id)
    j = sh.jobs.get(r.job_id)

    def out(status: str, ver: int, detail: str = "") -> ReserveResult:
        return ReserveResult(status=status, job_id=r.job_id, gpu_id=r.gpu_id, ver=ver, detail=detail)

    if j is not None and j.state != "pending":
        return out("known", 0, j.state)
    slots = r.all_slots()
    # the GPUs touched, as copies: id -> (stored GPU, its instances); written back once every check passed
    work: dict[str, tuple[StoredGpu, list[StoredInstance]]] = {}
    claimed: set[str] = set()

    def load(gid: str) -> tuple[StoredGpu, list[StoredInstance]] | None:
        if gid not in work:
            _, g = store._gpu(gid)
            if g is None:
                return None
            work[gid] = (g, copy.deepcopy(g.instances))
        return work[gid]

    first: StoredGpu | None = None
    for s in slots:
        got = load(s.gpu_id)
        if got is None:
            return out("nogpu", 0, s.gpu_id)
        g = got[0]
        first = first or g
        if g.ver != s.expected_ver:
            return out("conflict", first.ver, f"{s.gpu_id} version {g.ver}")
        if not g.healthy:
            return out("unhealthy", first.ver, s.gpu_id)
        if g.node != first.node and not r.span:
            return out("node", first.ver, f"{s.gpu_id} is on another node")
        claimed.add(s.gpu_id)
    assert first is not None
    for v in r.victims:
        vj = sh.jobs.get(v.job_id)
        if vj is None or vj.state != "running" or not names(vj, v.instance_id):
            state = vj.state if vj else "unknown"
            return out("victim", first.ver, f"{v.job_id} is {state} on {(vj.gpu if vj else '') or '-'}")
        for gid, iid in vj.held():
            got = load(gid)
            vi = next((x for x in got[1] if x.id == iid), None) if got else None
            if got is None or vi is None or vi.job != v.job_id or not vi.pre:
                return out("victim", first.ver, iid)
            vacate(got[1], iid, v.job_id, False)
    new_ids: list[tuple[str, str]] = []
    for s in slots:
        g, insts = work[s.gpu_id]
        new = copy.deepcopy(s.instance)
        ver = first.ver
        if new.profile in PLAIN_PROFILES:
            if g.mig:
                return out("mode", ver, f"{s.gpu_id} is in MIG mode")
            for i in insts:
                if new.profile == "gpu" or i.profile == "gpu":
                    return out("busy", ver, i.id)
                if i.start == new.start:
                    return out("overlap", ver, i.id)
            if new.profile == "shared" and (new.start >= g.replicas or len(insts) >= g.replicas):
                return out("count", ver, f"{s.gpu_id} has {g.replicas} replicas")
            new.state, new.job, new.created = "reserved", r.job_id, True
            insts.append(new)
        elif not g.mig:
            return out("mode", ver, f"{s.gpu_id} is not in MIG mode")
        elif s.action == "reuse":
            reused = next((x for x in insts if x.id == new.id), None)
            if reused is None:
                return out("gone", ver, new.id)
            if reused.state != "idle":
                return out("busy", ver, new.id)
            reused.state, reused.job, reused.prio, reused.ls, reused.mig, reused.tenant, reused.pre, reused.created = (
                "reserved",
                r.job_id,
                new.prio,
                new.ls,
                new.mig,
                new.tenant,
                new.pre,
                False,
            )
            reused.ends = new.ends
        else:
            for did in s.destroy:
                gone = next((x for x in insts if x.id == did), None)
                if gone is not None:
                    if gone.state != "idle":
                        return out("busy", ver, did)
                    insts.remove(gone)
            same = 0
            for i in insts:
                if i.mask & new.mask:
                    return out("overlap", ver, i.id)
                same += i.profile == new.profile
            if same >= s.max_count:
                return out("count", ver, new.profile)
            new.state, new.job, new.created = "reserved", r.job_id, True
            insts.append(new)
        new_ids.append((s.gpu_id, new.id))
    over = over_quota(sh, r)
    if over is not None:
        return out("quota", first.ver, over)
    for v in r.victims:
        vj = sh.jobs[v.job_id]
        vj.gpu = vj.inst = vj.node = vj.mig_gpu = vj.mig_inst = ""
        vj.slots = vj.mig_gone = ()
        vj.preempted += 1
        vj.attempts += 1
        sh.pending[v.job_id] = prio_score(vj.prio, vj.at)
        store._state(sh, v.job_id, "running", "pending", v.reason, now)
    ver = 0
    for n, (gid, (g, insts)) in enumerate(work.items()):
        g.instances = insts
        saved = store._save(sh, g, "claim" if gid in claimed else True)
        if n == 0:
            ver = saved
    prev = ""
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
    j.gpu, j.inst, j.node = r.gpu_id, new_ids[0][1], first.node
    j.slots = tuple(new_ids) if len(new_ids) > 1 else ()
    if r.tenant:
        store._charge(sh, r.job_id, r.tenant, r.usage)
    else:  # as reserve.lua: no tenant's charge left from an earlier placement
        j.tenant, j.usage = "", {}
    store._state(sh, r.job_id, prev, "placing", r.reason, now)
    if r.track and r.span:  # one place command per member node: place:<job>:<attempt>/<node rank>
        members: dict[str, str] = {}
        for s in slots:
            members.setdefault(work[s.gpu_id][0].node, s.gpu_id)
        for k, (node, gid) in enumerate(members.items()):
            sh.cmds[f"place:{r.job_id}:{j.attempts}/{k}"] = {
                "node": node, "kind": "place", "job": r.job_id, "gpu": gid, "at": now,
            }
    elif r.track:
        sh.cmds[f"place:{r.job_id}:{j.attempts}"] = {
            "node": first.node, "kind": "place", "job": r.job_id, "gpu": r.gpu_id, "at": now,
        }
    res = out("ok", ver, str(j.attempts))
    if len(slots) == 1:
        return res
    return msgspec.structs.replace(res, master_addr=sh.nodes.get(first.node, {}).get("addr", ""))


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
