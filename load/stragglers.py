"""What the stack holds about the jobs the recorder gave up on (the stack must lose nothing under load).

When ``python -m load`` stops waiting with jobs short of their final stage (``--stragglers FILE``, default
``$MIGSCHED_LOAD_STRAGGLERS``), it reads, while the stack still runs, what Redis says about each of them
(``MIGSCHED_REDIS_URL``; the key layout of ``shared.state.keys``, the job's shard by ``shard_of``): the job hash
``:job:<id>``, its history ``:hist:<id>``, whether it is in ``:pending``, ``:placing`` and ``:done``, and the
``:cmds`` entries naming it. Each job's keys are read in one MULTI/EXEC (a chunk of jobs at a time). The JSON file:

    {"written_at": <unix s>, "namespace": ..., "shards": n, "final": "exit", "watched": [...],
     "count": <stragglers>, "listed": <jobs in "jobs": at most 2000, those not pending first, oldest first>,
     "states": {"running": 3, "finished": 1, ...},          # every straggler's Redis state ("absent": no hash)
     "verdicts": {"finished in Redis: ...": 1, ...},         # of the listed ones
     "jobs": {"<id>": {"stages_ms": {"submit": 0.0, "command": 4.1},   # after the intended submit instant
                       "missing": ["exit"],                              # watched stages never seen
                       "job": {"state": ..., "gpu": ..., ...},           # the hash (``spec`` as JSON)
                       "history": [{"at": ..., "from": ..., "to": ..., "reason": ...}, ...],
                       "pending": bool, "placing": bool, "done": bool,
                       "cmds": {"<command id>": {"node": ..., "kind": ..., "job": ..., "at": ...}},
                       "verdict": "..."}}}

``verdict`` names the transition that is missing and what should have made it (docs/architecture.md):
a job still queued is backlog, not lost; one that Redis shows ``finished`` had its exit published but never
seen by the recorder.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from shared.state.codec import history_raw
from shared.state.job_routes import JobRoutes
from shared.state.keys import Keys

TERMINAL = frozenset({"finished", "failed", "cancelled", "rejected"})
LIST_AT_MOST = 2000
"""Jobs listed in full (a stalled stack can leave thousands short; the counts still cover them all)."""


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _is_history_field(name: str) -> bool:
    """``hn`` and ``h<n>``: the history's count and entries, listed apart under "history"."""
    return name == "hn" or (name[:1] == "h" and name[1:].isdigit())


def _json(x: Any) -> Any:
    try:
        return json.loads(_s(x))
    except ValueError:
        return _s(x)


def verdict(stages: Mapping[str, int], missing: Iterable[str], rec: Mapping[str, Any]) -> str:
    """Which transition a straggler lacks and what should have made it, from its Redis state."""
    job: Mapping[str, Any] = rec.get("job") or {}
    state = job.get("state")
    missing = list(missing)
    cmds = rec.get("cmds") or {}
    if not job:
        if rec.get("done") or rec.get("pending") or rec.get("placing"):
            return "no job hash but still indexed (a partial write or an expiry race)"
        return "unknown to Redis: the submit never reached the balancer's reserve/enqueue (or it expired)"
    if state in TERMINAL:
        last = (rec.get("history") or [{}])[-1]
        came_from = last.get("from") if isinstance(last, dict) else None
        if came_from in ("placing", "pending", ""):  # fail_placement, a rejection, a cancel: no job_exit
            return (f"{state} from {came_from or 'submit'} ({last.get('reason', '')[:200]}): it never ran, and "
                    f"no jobs.exit is published for such a job")
        return (f"{state} in Redis: the release ran; its jobs.exit was not seen by the recorder "
                f"(not published, or lost on the way)" if "exit" in missing else f"{state} in Redis")
    if state == "pending":
        return "pending (queued, waiting for room): backlog, not lost" if rec.get("pending") else \
            "pending but not in :pending: nothing will ever place it (enqueue/release/requeue left it out)"
    if state == "placing":
        place = [c for c, v in cmds.items() if isinstance(v, dict) and v.get("kind") == "place"]
        if not rec.get("placing"):
            return "placing but not in :placing: the lost-placement sweep cannot find it"
        if not place:
            return ("placing with no place command in :cmds: sched.placed not handled by the node registry "
                    "(or its command record lost)")
        return (f"placing, command {place[0]} in flight: no cmd_done/cmd_failed applied "
                f"(executor never ran it, or the registry's mark_running did not)")
    if state == "running":
        return ("running: no job_exit applied (the executor never reported the exit, or the registry's "
                "release refused it)")
    if state == "migrating":
        return "migrating: the move never committed or aborted, and no exit released it"
    return f"state {state!r}"


def summarize(listed: Mapping[str, Mapping[str, Any]], states: Counter[str]) -> dict[str, Any]:
    """``states``: every straggler's; ``verdicts``: the listed ones'."""
    return {"states": dict(states.most_common()),
            "verdicts": dict(Counter(str(j.get("verdict")) for j in listed.values()).most_common())}


CHUNK = 250
"""Jobs per MULTI/EXEC: a stalled stack can leave 100,000 short, and one transaction over all of them would stall
Redis (and time out the read)."""


async def _shards_of(redis: Any, namespace: str, shards: int, jobs: list[str]) -> dict[str, int]:
    """Each job's shard (``JobRoutes.shards_of``: its home's, unless its home routed it to another), read in
    chunks."""
    routes = JobRoutes(redis, [Keys(namespace, s) for s in range(shards)])
    where: dict[str, int] = {}
    for i in range(0, len(jobs), CHUNK * 8):
        where.update(await routes.shards_of(jobs[i: i + CHUNK * 8]))
    return where


async def snapshot(redis: Any, namespace: str, shards: int, timelines: Mapping[str, Mapping[str, int]],
                   watched: Iterable[str], *, limit: int = LIST_AT_MOST) -> dict[str, Any]:
    """What Redis holds about each job of ``timelines`` (job id -> stage -> monotonic ns, with ``submit``).

    Every job's state is counted; at most ``limit`` are listed in full: those not ``pending`` first (a queued
    job is backlog), then by submit instant, the oldest first."""
    watched = tuple(watched)
    where = await _shards_of(redis, namespace, shards, list(timelines))
    by_shard: dict[int, list[str]] = {}
    for j in timelines:
        by_shard.setdefault(where[j], []).append(j)
    state_of: dict[str, str] = {}
    for shard, members in sorted(by_shard.items()):
        keys = Keys(namespace, shard)
        for i in range(0, len(members), CHUNK * 8):
            part = members[i: i + CHUNK * 8]
            pipe = redis.pipeline(transaction=False)
            for j in part:
                pipe.hget(keys.job(j), "state")
            for j, st in zip(part, await pipe.execute(), strict=True):
                state_of[j] = _s(st) if st is not None else "absent"
    states: Counter[str] = Counter(state_of.values())
    chosen = sorted(timelines, key=lambda j: (state_of[j] == "pending", timelines[j].get("submit", 0), j))[:limit]
    out: dict[str, dict[str, Any]] = {}
    for shard in sorted({where[j] for j in chosen}):
        keys = Keys(namespace, shard)
        members = [j for j in chosen if where[j] == shard]
        cmds_by_job: dict[str, dict[str, Any]] = {}
        for cid, raw in ((await redis.hgetall(keys.cmds)) or {}).items():
            v = _json(raw)
            if isinstance(v, dict) and v.get("job") is not None:
                cmds_by_job.setdefault(str(v["job"]), {})[_s(cid)] = v
        for i in range(0, len(members), CHUNK):
            part = members[i: i + CHUNK]
            pipe = redis.pipeline(transaction=True)  # each job's keys read at one instant
            for j in part:
                pipe.hgetall(keys.job(j))
                pipe.lrange(keys.hist(j), 0, -1)
                pipe.zscore(keys.pending, j)
                pipe.zscore(keys.placing, j)
                pipe.zscore(keys.done, j)
            res = await pipe.execute()
            for n, j in enumerate(part):
                h, hist, pend, plac, done = res[5 * n: 5 * n + 5]
                entries = history_raw(h, hist)
                job = {_s(k): _s(v) for k, v in (h or {}).items() if not _is_history_field(_s(k))}
                if "spec" in job:
                    job["spec"] = _json(job["spec"])
                tl = timelines[j]
                t0 = tl.get("submit", 0)
                rec: dict[str, Any] = {
                    "stages_ms": {st: round((t - t0) / 1e6, 3)
                                  for st, t in sorted(tl.items(), key=lambda kv: kv[1])},
                    "missing": [st for st in watched if st not in tl],
                    "job": job,
                    "history": [_json(x) for x in entries],
                    "pending": pend is not None, "placing": plac is not None, "done": done is not None,
                    "cmds": cmds_by_job.get(j, {}),
                }
                rec["verdict"] = verdict(tl, rec["missing"], rec)
                out[j] = rec
    listed = {j: out[j] for j in chosen}
    return {"written_at": time.time(), "namespace": namespace, "shards": shards, "watched": list(watched),
            "count": len(timelines), "listed": len(listed), **summarize(listed, states), "jobs": listed}


async def write(path: str | Path, timelines: Mapping[str, Mapping[str, int]], *, namespace: str, final: str,
                watched: Iterable[str], redis_url: str | None = None, shards: int | None = None) -> dict[str, Any]:
    """Snapshot the stragglers and write them as JSON to ``path``; returns what was written. Without a Redis
    URL (``MIGSCHED_REDIS_URL``) only the recorded stage instants are written."""
    url = redis_url or os.environ.get("MIGSCHED_REDIS_URL")
    n = shards or int(os.environ.get("MIGSCHED_SHARDS", "1") or 1)
    if url:
        import redis.asyncio as aioredis

        client = aioredis.from_url(url, decode_responses=False)
        try:
            data = await snapshot(client, namespace, n, timelines, watched)
        finally:
            await client.aclose()
    else:
        watched = tuple(watched)
        data = {"written_at": time.time(), "namespace": namespace, "shards": n, "watched": list(watched),
                "count": len(timelines), "listed": len(timelines), "states": {}, "verdicts": {},
                "error": "no Redis URL (MIGSCHED_REDIS_URL): recorded stages only",
                "jobs": {j: {"stages_ms": {st: round((t - tl.get("submit", 0)) / 1e6, 3) for st, t in tl.items()},
                             "missing": [st for st in watched if st not in tl]} for j, tl in timelines.items()}}
    data["final"] = final
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return data


def note(data: Mapping[str, Any], path: str | Path) -> str:
    """One line for the report's notes."""
    states = ", ".join(f"{k} {v}" for k, v in data.get("states", {}).items()) or "no Redis state read"
    return f"stragglers ({data.get('count', 0)}) by Redis state: {states}; details in {path}"
