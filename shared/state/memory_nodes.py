"""Node registration and loss for ``MemoryState`` (mirrors ``lua/node.lua``)."""

from __future__ import annotations

import functools
import json
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


def _evict(
    store: Any,
    sh: Any,
    insts: list[StoredInstance],
    keep: Any,
    reason: str,
    now: float,
    requeued: list[str],
    gangs: list[tuple[str, tuple[tuple[str, str], ...]]],
    moves: list[Move],
) -> list[StoredInstance]:
    out = []
    for i in insts:
        if keep(i):
            out.append(i)
        elif i.job and i.state != "idle":
            j = sh.jobs.get(i.job)
            if j is not None and j.state in ("placing", "running", "migrating") and names(j, i.id):
                if j.slots:
                    gangs.append((i.job, j.slots))
                if j.state == "migrating":
                    moves.append((i.job, ((j.gpu, j.inst), (j.mig_gpu, j.mig_inst))))
                store._requeue(sh, i.job, j.state, reason, now)
                requeued.append(i.job)
    return out


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
    requeued: list[str] = []
    drift: list[str] = []
    stops: Stops = []
    gangs: list[tuple[str, tuple[tuple[str, str], ...]]] = []
    moves: list[Move] = []
    reported_ids = {r["id"] for g in gpus for r in g.get("instances", ())}
    ids = []
    for g in gpus:
        ids.append(g["id"])
        reported = [
            StoredInstance(
                **{k: v for k, v in r.items() if k in ("id", "profile", "start", "size", "compute")}
            )
            for r in g.get("instances", [])
        ]
        rjob: dict[str, str] = {r["id"]: r["job"] for r in g.get("instances", []) if r.get("job")}
        cur = sh.gpus.get(g["id"])
        if cur is None:
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
            continue
        by_id = {r.id: r for r in reported}
        running = set(g.get("jobs", ()))

        def keep(
            i: StoredInstance,
            gid: str = g["id"],
            by_id: dict[str, StoredInstance] = by_id,
            running: set[str] = running,
        ) -> bool:
            if i.id in by_id:
                del by_id[i.id]
                return True
            if i.profile in PLAIN_PROFILES and i.job and i.job in running:
                return True
            if i.state in ("reserved", "target"):
                return True
            if i.state != "idle":
                drift.append(f"{gid}: {i.id} ({i.state}) not reported")
            return False

        kept = _evict(
            store,
            sh,
            cur.instances,
            keep,
            f"node {node} re-registered without the instance",
            now,
            requeued,
            gangs,
            moves,
        )
        for i in kept:
            job = rjob.get(i.id)
            held = i.job == job and i.state not in ("idle", "retiring")
            if job and not held:
                if i.state in ("idle", "retiring"):
                    _stop_foreign(i, job, g["id"], stops)
                else:
                    stops.append((job, g["id"], i.id))
        for r in reported:
            if r.id in by_id:
                job = rjob.get(r.id)
                # as node.lua: a one-GPU reservation in its way is re-queued and what the node has adopted
                kept = _evict(store, sh, kept, functools.partial(_not_in_way, sh, r),
                              f"node {node} holds {r.id} where the reservation is", now, requeued, gangs,
                              moves)
                if any(i.mask & r.mask for i in kept):
                    drift.append(f"{g['id']}: reported {r.id} overlaps the state")
                    if job:
                        stops.append((job, g["id"], r.id))
                else:
                    if job:
                        _stop_foreign(r, job, g["id"], stops)
                    kept.append(r)
        cur.instances = kept
        cur.mig, cur.healthy, cur.model, cur.uuid, cur.replicas = (
            bool(g["mig"]),
            bool(g["healthy"]),
            g["model"],
            g.get("uuid", ""),
            int(g.get("replicas", 0)),
        )
        store._save(sh, cur, "claim")
    _free_moves(store, moves, node, reported_ids, stops)
    _free_gangs(store, sh, gangs, node, stops)
    sh.nodes[node] = {
        "state": "up",
        "last_seen": repr(now),
        "registered_at": repr(now),
        "gpus": ",".join(ids),
        "reg_id": reg_id,
        "addr": addr,
        "labels": json.dumps(labels or {}, sort_keys=True),
    }
    return {"requeued": requeued, "drift": drift, "gpus": ids, "stops": [list(x) for x in stops]}


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
    requeued: list[str] = []
    gangs: list[tuple[str, tuple[tuple[str, str], ...]]] = []
    moves: list[Move] = []
    ids = [g for g in h["gpus"].split(",") if g]
    for gid in ids:
        g = sh.gpus[gid]
        _evict(store, sh, g.instances, lambda i: False, reason, now, requeued, gangs, moves)
        g.healthy = False
        g.instances = []
        store._save(sh, g, "claim")
    stops: Stops = []
    _free_moves(store, moves, node, None, stops)
    _free_gangs(store, sh, gangs, node, stops)
    h["state"] = "lost"
    h["lost_at"] = repr(now)
    return {"requeued": requeued, "drift": [], "gpus": ids, "stops": [list(x) for x in stops]}
