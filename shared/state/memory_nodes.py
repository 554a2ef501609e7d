"""Node registration and loss for ``MemoryState`` (mirrors ``lua/node.lua``)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from shared.state.memory_slots import hold_for_stop, hold_members, idle, names, spans, vacate
from shared.state.model import PLAIN_PROFILES, StoredGpu, StoredInstance

Stops = list[tuple[str, ...]]
"""(job, gpu id, instance id[, node]): jobs a registration found running where the state does not hold them
(the node: another node's part of a gang across nodes, or copy of a moving job, re-queued from this one)."""
Move = tuple[str, tuple[tuple[str, str], ...]]
"""A re-queued moving job and its (gpu id, instance id) pairs: the source, then the target."""


def _stop_foreign(i: StoredInstance, job: str, gid: str, stops: Stops) -> None:
    """As ``stop_foreign`` in node.lua: the instance stays occupied (``retiring`` with the job) until the job
    is stopped, so that no placement reuses it."""
    hold_for_stop(i, job)
    stops.append((job, gid, i.id))


class _Eviction:
    """What evicting a node's instances left to do: the jobs re-queued, the gangs and moves among them whose
    other instances are freed at the end (``finish``), and the jobs to stop."""

    def __init__(self, store: Any, sh: Any, now: float) -> None:
        self.store, self.sh, self.now = store, sh, now
        self.requeued: list[str] = []
        self.gangs: list[tuple[str, tuple[tuple[str, str], ...]]] = []
        self.moves: list[Move] = []
        self.stops: Stops = []

    def evict(self, insts: list[StoredInstance], keep: Callable[[StoredInstance], bool],
              reason: str) -> list[StoredInstance]:
        """The instances ``keep`` keeps; the job placed on any other is re-queued."""
        sh = self.sh
        out = []
        for i in insts:
            if keep(i):
                out.append(i)
            elif i.job and i.state != "idle":
                j = sh.jobs.get(i.job)
                if j is not None and j.state in ("placing", "running", "migrating") and names(j, i.id):
                    if j.slots:
                        self.gangs.append((i.job, j.slots))
                    if j.state == "migrating":
                        self.moves.append((i.job, ((j.gpu, j.inst), (j.mig_gpu, j.mig_inst))))
                    self.store._requeue(sh, i.job, j.state, reason, self.now)
                    self.requeued.append(i.job)
        return out

    def finish(self, node: str, reported: set[str] | None) -> None:
        """The re-queued moves' and gangs' instances elsewhere freed, or held until their nodes stop them."""
        _free_moves(self.store, self.moves, node, reported, self.stops)
        _free_gangs(self.store, self.sh, self.gangs, node, self.stops)


def _free_moves(store: Any, moves: list[Move], node: str, reported: set[str] | None, stops: Stops) -> None:
    """As ``free_moves`` in node.lua: a re-queued job that was moving leaves its other copy's instance behind.
    On ``node`` an instance it did not report (``reported``: the instance ids a registration reported; None when
    the node is lost) is removed and any other idles; on another node the job's copy may run still, so its
    instance stays taken (``retiring`` with the job) and ``stops`` names it with that node."""
    for job, pairs in moves:
        for gid, iid in pairs:
            sh, g = store._gpu(gid) if gid and iid else (None, None)
            i = next((x for x in g.instances if x.id == iid), None) if g is not None else None
            if g is None or i is None or i.job != job or i.state == "idle":
                continue
            if g.node != node:
                hold_for_stop(i, job)
                stops.append((job, gid, iid, g.node))
                store._save(sh, g, "claim")
                continue
            if reported is not None and iid not in reported:
                g.instances.remove(i)
            else:
                idle(i)
            store._save(sh, g)


def _not_in_way(sh: Any, r: StoredInstance, i: StoredInstance) -> bool:
    """False for a one-GPU reservation that the reported instance ``r`` overlaps (``register`` re-queues it)."""
    j = sh.jobs.get(i.job) if i.job else None
    return not (i.mask & r.mask) or i.state != "reserved" or not i.job or bool(j is not None and j.slots)


def _free_gangs(
    store: Any, sh: Any, gangs: list[tuple[str, tuple[tuple[str, str], ...]]], node: str, stops: list[Any]
) -> None:
    """A re-queued gang leaves its instances on its other GPUs behind: free them (as ``free_gangs``). A gang
    across nodes keeps its parts on the other nodes taken until each confirms a stop (listed in ``stops`` with
    its node)."""
    for job, slots in gangs:
        if spans(slots):
            stops.extend((job, gid, iid, n) for n, gid, iid in hold_members(store, sh, job, slots, node))
        for gid, iid in slots:
            _, g = store._gpu(gid)
            i = next((x for x in g.instances if x.id == iid), None) if g else None
            if g is not None and i is not None and i.job == job and i.state not in ("idle", "retiring"):
                vacate(g.instances, iid, job, False)
                store._save(sh, g)


def register(
    store: Any, sh: Any, node: str, gpus: list[dict[str, Any]], now: float, reg_id: str = "", addr: str = "",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    h = sh.nodes.get(node)
    if reg_id and h is not None and h.get("reg_id") == reg_id:  # redelivered: applied already
        return {"requeued": [], "drift": [], "gpus": [g for g in h["gpus"].split(",") if g], "replay": True}
    ev = _Eviction(store, sh, now)
    drift: list[str] = []
    for g in gpus:
        cur = sh.gpus.get(g["id"])
        if cur is None:
            _add_gpu(store, sh, node, g, ev.stops)
        else:
            _refresh_gpu(ev, node, g, cur, drift)
    ev.finish(node, {r["id"] for g in gpus for r in g.get("instances", ())})
    ids = [g["id"] for g in gpus]
    sh.nodes[node] = {
        "state": "up",
        "last_seen": repr(now),
        "registered_at": repr(now),
        "gpus": ",".join(ids),
        "reg_id": reg_id,
        "addr": addr,
        "labels": json.dumps(labels or {}, sort_keys=True),
    }
    return {"requeued": ev.requeued, "drift": drift, "gpus": ids, "stops": [list(x) for x in ev.stops]}


def _reported(g: dict[str, Any]) -> tuple[list[StoredInstance], dict[str, str]]:
    """The instances a registration reports on GPU ``g``, and the job running on each that runs one."""
    raw = g.get("instances", [])
    fields = ("id", "profile", "start", "size", "compute")
    return [StoredInstance(**{k: v for k, v in r.items() if k in fields}) for r in raw], {
        r["id"]: r["job"] for r in raw if r.get("job")
    }


def _add_gpu(store: Any, sh: Any, node: str, g: dict[str, Any], stops: Stops) -> None:
    """A GPU the state has never seen, taken as reported; a job it runs is no placement's, so it is stopped."""
    reported, rjob = _reported(g)
    for r in reported:
        if r.id in rjob:
            _stop_foreign(r, rjob[r.id], g["id"], stops)
    cur = sh.gpus[g["id"]] = StoredGpu(
        id=g["id"],
        node=node,
        index=g["index"],
        model=g["model"],
        mig=bool(g["mig"]),
        healthy=bool(g["healthy"]),
        ver=0,
        pos=len(sh.gpus),
        uuid=g.get("uuid", ""),
        replicas=int(g.get("replicas", 0)),
        instances=reported,
    )
    store._save(sh, cur, "claim")


def _refresh_gpu(ev: _Eviction, node: str, g: dict[str, Any], cur: StoredGpu, drift: list[str]) -> None:
    """A known GPU reconciled with its report: instances the node no longer has are evicted (their jobs
    re-queued), jobs the state does not hold there are stopped, and reported instances the state lacks are
    adopted where nothing overlaps them."""
    gid = g["id"]
    reported, rjob = _reported(g)
    unknown = {r.id: r for r in reported}  # what ``keep`` does not match is reported but not in the state
    running = set(g.get("jobs", ()))

    def keep(i: StoredInstance) -> bool:
        if i.id in unknown:
            del unknown[i.id]
            return True
        if i.profile in PLAIN_PROFILES and i.job and i.job in running:
            return True
        if i.state in ("reserved", "target"):
            return True
        if i.state != "idle":
            drift.append(f"{gid}: {i.id} ({i.state}) not reported")
        return False

    kept = ev.evict(cur.instances, keep, f"node {node} re-registered without the instance")
    for i in kept:
        job = rjob.get(i.id)
        held = i.job == job and i.state not in ("idle", "retiring")
        if job and not held:
            if i.state in ("idle", "retiring"):
                _stop_foreign(i, job, gid, ev.stops)
            else:
                ev.stops.append((job, gid, i.id))
    for r in reported:
        if r.id in unknown:
            kept = _adopt(ev, node, gid, r, rjob.get(r.id), kept, drift)
    cur.instances = kept
    cur.mig, cur.healthy, cur.model = bool(g["mig"]), bool(g["healthy"]), g["model"]
    cur.uuid, cur.replicas = g.get("uuid", ""), int(g.get("replicas", 0))
    ev.store._save(ev.sh, cur, "claim")


def _adopt(ev: _Eviction, node: str, gid: str, r: StoredInstance, job: str | None, kept: list[StoredInstance],
           drift: list[str]) -> list[StoredInstance]:
    """A reported instance the state lacks: as node.lua, a one-GPU reservation in its way is re-queued and the
    instance adopted (its job stopped), unless it overlaps what the state holds there."""
    in_way = f"node {node} holds {r.id} where the reservation is"
    kept = ev.evict(kept, functools.partial(_not_in_way, ev.sh, r), in_way)
    if any(i.mask & r.mask for i in kept):
        drift.append(f"{gid}: reported {r.id} overlaps the state")
        if job:
            ev.stops.append((job, gid, r.id))
        return kept
    if job:
        _stop_foreign(r, job, gid, ev.stops)
    kept.append(r)
    return kept


def stopped(store: Any, sh: Any, node: str, job: str) -> dict[str, Any]:
    """As 'stopped' in node.lua: the instances kept ``retiring`` for ``job`` (found by a registration, or started
    by a place command applied late) become idle."""
    h = sh.nodes.get(node) or {}
    freed = []
    for gid in (g for g in h.get("gpus", "").split(",") if g):
        g = sh.gpus.get(gid)
        hits = [i for i in g.instances if i.state == "retiring" and i.job == job] if g else []
        for i in hits:
            if i.profile in PLAIN_PROFILES:  # a plain instance leaves with its job
                g.instances.remove(i)
            else:
                idle(i)
        if g is not None and hits:
            store._save(sh, g)
            freed.append(gid)
    return {"gpus": freed}


def lost(store: Any, sh: Any, node: str, now: float, reason: str) -> dict[str, Any]:
    h = sh.nodes.get(node)
    if h is None or h.get("state") != "up":
        return {"requeued": [], "drift": [], "gpus": []}
    ev = _Eviction(store, sh, now)
    ids = [g for g in h["gpus"].split(",") if g]
    for gid in ids:
        g = sh.gpus[gid]
        ev.evict(g.instances, lambda i: False, reason)
        g.healthy = False
        g.instances = []
        store._save(sh, g, "claim")
    ev.finish(node, None)
    h["state"] = "lost"
    h["lost_at"] = repr(now)
    return {"requeued": ev.requeued, "drift": [], "gpus": ids, "stops": [list(x) for x in ev.stops]}
