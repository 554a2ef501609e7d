"""``MemoryState``'s release (mirrors ``lua/release.lua``): a job leaves its instances on an exit, a lost
placement or a stop, and goes to the state its exit kind names; one member node's exit of a gang across nodes
frees that node's part only, unless it ends the gang."""

from __future__ import annotations

import copy
from typing import Any

from shared.state.memory_prelude import _ACTIVE
from shared.state.memory_slots import (
    give_back,
    hold_for_stop,
    hold_members,
    idle,
    inst_node,
    job_nodes,
    names,
    node_of,
    spans,
    vacate,
)
from shared.state.model import EXIT_TO_STATE, JobRecord, ReleaseResult, StoredGpu


def release(
    store: Any, job: str, kind: str, reason: str, now: float, instance_id: str = "", node: str = "",
    attempt: int | None = None, report: str = "",
) -> ReleaseResult:
    sh = store._js(job)
    j = sh.jobs.get(job)
    if j is None or j.state not in _ACTIVE:
        return _settled(store, sh, job, j, instance_id, report)
    if _stale(sh, j, instance_id, node, attempt):
        return ReleaseResult(status="stale", job_id=job, state=j.state, gpu_id=j.gpu, node=j.node)
    prev, gpu_id, node, slots = j.state, j.gpu, j.node, j.slots
    stops: list[tuple[str, str, str]] = []
    if instance_id and spans(j.held()):  # see release.lua: one member node's exit
        member = _member_exit(store, sh, j, kind, instance_id, now)
        if isinstance(member, ReleaseResult):
            return member
        slots, stops = member
    profile, first = _vacate_held(store, sh, j)
    stop, given = _drop_target(store, sh, j, instance_id, node)
    to = EXIT_TO_STATE[kind]
    if report:
        sh.xid[job] = report
    if to == "pending":
        store._requeue(sh, job, prev, reason, now)
    else:
        store._state(sh, job, prev, to, reason, now)
    return ReleaseResult(
        status="ok",
        job_id=job,
        state=to,
        gpu_id=gpu_id,
        node=node,
        instance_id=instance_id,
        profile=profile,
        gpu=copy.deepcopy(first),
        slots=slots,
        stop=stop,
        given_back=given,
        stops=tuple(stops),
    )


def _settled(store: Any, sh: Any, job: str, j: JobRecord | None, instance_id: str, report: str) -> ReleaseResult:
    """A job no longer active: nothing to do. A repeat of the report that ended it names its GPU as it is now
    (see release.lua), so the caller can publish the same release again."""
    released_by = sh.xid.get(job)
    same = released_by is None or not report or report == released_by
    if j is not None and j.gpu and instance_id and instance_id == j.inst and same:
        _, g0 = store._gpu(j.gpu)
        if g0 is not None:
            return ReleaseResult(
                status="noop", job_id=job, state=j.state, gpu_id=j.gpu, node=j.node, gpu=copy.deepcopy(g0),
            )
    return ReleaseResult(status="noop", job_id=job, state=j.state if j else "")


def _stale(sh: Any, j: JobRecord, instance_id: str, node: str, attempt: int | None) -> bool:
    """The release is an earlier placement's run, or names an instance or node the job does not hold now."""
    current = j.attempts
    ra = sh.ra.get(j.job_id)
    if ra is not None and ra[0] == current:
        current = ra[1]
    if attempt is not None and attempt < current:
        return True
    across = bool(instance_id) and spans(j.held())
    if instance_id and instance_id not in (j.inst, j.mig_inst) and not (across and names(j, instance_id)):
        return True
    return not instance_id and bool(node) and node not in job_nodes(j)


def _member_exit(
    store: Any, sh: Any, j: JobRecord, kind: str, instance_id: str, now: float
) -> ReleaseResult | tuple[tuple[tuple[str, str], ...], list[tuple[str, str, str]]]:
    """One member node of a gang across nodes exited: its part is vacated. A part that completed while others
    run is the whole answer (``member``); otherwise the gang ends, the parts on other nodes held until each
    confirms a stop. Returns that answer, or the freed slots and the stops to send."""
    job, prev = j.job_id, j.state
    member = inst_node(instance_id)
    mine, others = [], False
    for gid, iid in j.held():
        _, g = store._gpu(gid)
        i = next((x for x in g.instances if x.id == iid), None) if g else None
        if g is None or i is None or i.job != job:
            continue
        if node_of(gid) == member:
            mine.append((g, gid, iid))
        else:
            others = True
    if not mine:
        return ReleaseResult(status="noop", job_id=job, state=prev)
    for g, _gid, iid in mine:
        vacate(g.instances, iid, job, False)
        store._save(sh, g)
    freed = tuple((gid, iid) for _g, gid, iid in mine)
    if others and EXIT_TO_STATE[kind] == "finished":
        store._hist(sh, job, prev, prev, f"node {member} completed its part of the gang", now)
        return ReleaseResult(status="member", job_id=job, state=prev, gpu_id=freed[0][0], node=member,
                             instance_id=instance_id, slots=freed)
    return freed, (hold_members(store, sh, job, j.held(), member) if others else [])


def _vacate_held(store: Any, sh: Any, j: JobRecord) -> tuple[str, StoredGpu | None]:
    """The job leaves every instance it holds (those held retiring for a stop stay so); returns the profile it
    left on its first GPU and that GPU."""
    profile = ""
    first: StoredGpu | None = None
    for n, (gid, iid) in enumerate(j.held()):
        _, g = store._gpu(gid)
        if g is None:
            continue
        held = next((x for x in g.instances if x.id == iid), None)
        left = vacate(g.instances, iid, j.job_id, False) if held is None or held.state != "retiring" else None
        if n == 0:
            first, profile = g, left.profile if left else ""
        store._save(sh, g)
    return profile, first


def _drop_target(
    store: Any, sh: Any, j: JobRecord, instance_id: str, node: str
) -> tuple[tuple[str, str, str] | None, str]:
    """A moving job's target is given up: an exit from the source drops a target it created (held for a stop
    when it lies on another node), any other idles, and the idle instances the move removed come back.
    Returns the stop to send and what came back (``<gpu>|<ids>``)."""
    job = j.job_id
    stop: tuple[str, str, str] | None = None
    given = ""
    if j.state == "migrating" and j.mig_gpu:
        _, mg = store._gpu(j.mig_gpu)
        if mg is not None:
            for i in list(mg.instances):
                if i.id != j.mig_inst or i.job != job:
                    continue
                if i.created and instance_id and instance_id != j.mig_inst:
                    if mg.node and mg.node != node:
                        hold_for_stop(i, job)
                        stop = (mg.node, mg.id, i.id)
                    else:
                        mg.instances.remove(i)
                else:
                    idle(i)
            back = give_back(mg.instances, j.mig_gone, "retiring")
            store._save(sh, mg, "claim" if back else True)
            given = f"{mg.id}|{','.join(back)}" if back else ""
    j.mig_gpu = j.mig_inst = ""
    j.mig_gone = ()
    return stop, given
