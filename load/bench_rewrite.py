"""What an AOF rewrite costs per ended job, for the ways a job's record can be laid out in Redis.

A rewrite forks a child that writes the whole dataset; on the two-core load machine that child takes a core
from the stack for seconds (load/REPORT.md). This fills a private ``redis-server`` (the stack's tuning,
``shared.localservers.start_redis``) with ``--jobs`` ended jobs as the live stack leaves them, rewrites its
AOF once and prints the memory, the keys and the rewrite child's CPU, for each layout named:

- ``fields``: the job's history as fields ``h<n>`` of its hash (what ``lua/prelude.lua`` writes);
- ``list``: the history as a list key of its own (``:hist:<id>``, older versions);
- ``nojobs``: as ``list`` but without the ``:jobs`` set of every job id.

    .venv/bin/python -m load.bench_rewrite --jobs 200000 fields list
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import redis

from shared.localservers import start_redis

LAYOUTS = ("fields", "list", "nojobs")
_SPEC = json.dumps({
    "v": 1, "id": "m-L0241207e4f-5512", "job_id": "L0241207e4f-5512", "tenant": "load", "priority": 0,
    "priority_class": None, "demand": {"kind": "mig", "profile": "2g.10gb", "compute_slices": None,
                                       "memory_gb": None, "gpus": 1},
    "latency_sensitive": False, "migratable": True, "duration_hint_s": 2.56, "patience_s": None,
    "workload": {"argv": [], "env": {}, "run_as": None}, "labels": {}, "submitted_at": 1796092891.2352824,
})
_HIST = [json.dumps(h) for h in (
    {"at": 1796092891.2381, "from": "", "to": "placing", "reason": (
        "L0241207e4f-5512 -> gpu-node-5/43 2g.10gb@4 (reuse, lazy) frag 0.000->0.395; lazy tier (load 0.00 vs "
        "threshold 0.4); reuses idle instance gpu-node-5/43:2g.10gb@4:L0241207e4f-772; lowest FragCost after: "
        "0.395")},
    {"at": 1796092891.2439, "from": "placing", "to": "running", "reason": "executor started the workload"},
    {"at": 1796092893.8052, "from": "running", "to": "finished", "reason": "completed"},
)]


def job_fields(n: int) -> dict[str, Any]:
    """An ended job's hash as a 64 × 8 load run leaves it (without its history)."""
    return {"spec": _SPEC, "prio": 0, "at": 1796092891.2352824, "attempts": 0,
            "tp": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "gpu": "gpu-node-5/43",
            "inst": f"gpu-node-5/43:2g.10gb@4:L0241207e4f-{n}", "node": "gpu-node-5", "tenant": "load",
            "usage": '{"gpus":0.25}', "state": "finished", "reason": "completed", "updated": 1796092893.8052053}


def fill(r: redis.Redis, layout: str, jobs: int) -> None:
    pipe = r.pipeline(transaction=False)
    for n in range(jobs):
        j = f"L0241207e4f-{n}"
        f = job_fields(n)
        if layout == "fields":
            f |= {"hn": len(_HIST), **{f"h{k + 1}": h for k, h in enumerate(_HIST)}}
        else:
            pipe.rpush(f"{{m:0}}:hist:{j}", *_HIST)
        pipe.hset(f"{{m:0}}:job:{j}", mapping=f)
        if layout != "nojobs":
            pipe.sadd("{m:0}:jobs", j)
        pipe.zadd("{m:0}:done", {j: 1796092893.8 + n / 1000})
        if n % 1000 == 999:
            pipe.execute()
    pipe.execute()


def child_cpu(r: redis.Redis) -> float:
    c = r.info("cpu")
    return float(c["used_cpu_user_children"]) + float(c["used_cpu_sys_children"])


def measure(layout: str, jobs: int) -> dict[str, float]:
    """Fill a fresh private Redis, rewrite its AOF once; memory, keys and the rewrite's child CPU and time."""
    server = start_redis(appendonly=True)  # the stack's tuning; its 1-GB rewrite threshold keeps Redis from its own
    try:
        r = redis.Redis.from_url(server.url)
        fill(r, layout, jobs)
        mem = float(r.info("memory")["used_memory"])
        cpu0, t0 = child_cpu(r), time.perf_counter()
        r.bgrewriteaof()
        while True:
            p = r.info("persistence")
            if not p["aof_rewrite_in_progress"] and not p["aof_rewrite_scheduled"] and time.perf_counter() > t0 + 0.05:
                break
            time.sleep(0.01)
        return {"keys": float(r.dbsize()), "mib": mem / 2**20, "bytes_per_job": mem / jobs,
                "rewrite_s": time.perf_counter() - t0, "child_cpu_s": child_cpu(r) - cpu0}
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m load.bench_rewrite", description=__doc__.splitlines()[0])
    ap.add_argument("layouts", nargs="+", choices=LAYOUTS)
    ap.add_argument("--jobs", type=int, default=200_000)
    args = ap.parse_args(argv)
    for layout in args.layouts:
        m = measure(layout, args.jobs)
        print(f"{layout:7s} keys {m['keys']:9.0f}  used_memory {m['mib']:7.1f} MiB ({m['bytes_per_job']:5.0f} B a job)"
              f"  rewrite {m['rewrite_s']:5.2f} s, child CPU {m['child_cpu_s']:5.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
