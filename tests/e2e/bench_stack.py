"""Benchmark of the live stack as processes: sustained arrival rate and submit -> executor-command latency.

    .venv/bin/python tests/e2e/bench_stack.py --rates 250,500,1000 --seconds 5

One stack (balancer, registry, migration-planner, two sim executors of 64 x A100-40GB each, so that
capacity never limits the rate) in a fresh namespace; for each rate, ``rate x seconds`` jobs of ``1g.5gb``
that run ``--duration`` seconds are published on a timer (batches every 10 ms, as an external queue would).
Every executor appends ``job submitted_at received_at`` per place command
(``MIGSCHED_EXECUTOR_LATENCY_LOG``); the latency is
``received_at - submitted_at`` and the throughput is commands received per second over the run. Prints one
JSON line per rate. Not a test: it asserts nothing and is not collected by pytest.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stack_fixture import forget, settings_of

from migsched.stack import Stack, StackConfig
from shared.client import MigschedClient
from shared.state import TERMINAL_STATES, RedisState


async def one_rate(stack: Stack, log: Path, rate: float, seconds: float, duration: float, tag: str) -> dict:
    st = settings_of(stack)
    n = int(rate * seconds)
    ids = [f"{tag}-{i:06d}" for i in range(n)]
    before = len(log.read_text().splitlines()) if log.exists() else 0
    async with MigschedClient(st.nats_url, namespace=st.namespace) as client:
        t0 = time.time()
        i = 0
        while i < n:
            due = int((time.time() - t0) * rate) + 1
            batch = []
            while i < min(due, n):
                batch.append(MigschedClient.job(job_id=ids[i], profile="1g.5gb", duration_s=duration))
                i += 1
            if batch:
                await client.submit_many(batch)
            await asyncio.sleep(0.01)
        published = time.time() - t0
    deadline = time.time() + 60
    rows: list[list[str]] = []
    while time.time() < deadline:
        rows = [r.split() for r in log.read_text().splitlines()[before:]]
        if len([r for r in rows if r[0].startswith(tag)]) >= n:
            break
        await asyncio.sleep(0.2)
    mine = [r for r in rows if r[0].startswith(tag)]
    first: dict[str, tuple[float, float]] = {}
    for job, sub, rec in mine:  # a redelivered command counts once, at its first arrival
        first.setdefault(job, (float(sub), float(rec)))
    lat = np.array([rec - sub for sub, rec in first.values()]) * 1000
    span = max(rec for _, rec in first.values()) - min(sub for sub, _ in first.values()) if first else 0.0
    state = RedisState.from_settings(st)
    try:  # let the jobs end before the next rate, so each rate starts from an idle cluster
        end = time.time() + 60
        while time.time() < end:
            recs = await state.jobs(ids)
            if all(r is not None and r.state in TERMINAL_STATES for r in recs):
                break
            await asyncio.sleep(0.5)
        states: dict[str, int] = {}
        for r in await state.jobs(ids):
            k = r.state if r is not None else "missing"
            states[k] = states.get(k, 0) + 1
        # where the time goes: submit -> placing (the balancer's decision and commit), placing -> command (the
        # send: the balancer's publish and the CMD stream), command -> running (executor, its report and the
        # registry's transition)
        stages: dict[str, list[float]] = {"balancer": [], "send": [], "executor+report": []}
        for job in ids[:: max(1, len(ids) // 500)]:
            hist = await state.history(job)
            placing = next((h.at for h in hist if h.to == "placing"), None)
            running = next((h.at for h in hist if h.to == "running"), None)
            if job in first and placing is not None and running is not None:
                sub, rec = first[job]
                stages["balancer"].append(placing - sub)
                stages["send"].append(rec - placing)
                stages["executor+report"].append(running - rec)
    finally:
        await state.close()
    return {
        "rate_offered_per_s": rate,
        "jobs": n,
        "commands_received": len(first),
        "publish_s": round(published, 3),
        "throughput_per_s": round(len(first) / span, 1) if span > 0 else 0.0,
        "latency_ms_p50": round(float(np.percentile(lat, 50)), 2) if lat.size else None,
        "latency_ms_p99": round(float(np.percentile(lat, 99)), 2) if lat.size else None,
        "latency_ms_max": round(float(lat.max()), 2) if lat.size else None,
        "final_states": states,
        "stage_p50_ms": {k: round(float(np.percentile(v, 50)) * 1000, 2) for k, v in stages.items() if v},
    }


async def main(args: argparse.Namespace) -> None:
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    run_dir = Path(tempfile.mkdtemp(prefix="migsched-bench-"))
    log = run_dir / "latency.txt"
    stack = Stack(
        StackConfig(
            namespace=ns,
            executors=2,
            gpus="A100-40GB:64",
            run_dir=run_dir,
            reconfig_latency_s=args.reconfig,
            stream_storage="memory",
            heartbeat_s=1.0,
            metrics=False,
            env={
                "MIGSCHED_EXECUTOR_LATENCY_LOG": str(log),
                "MIGSCHED_LOG_LEVEL": "WARNING",
                "MIGSCHED_DEFRAG_INTERVAL_S": "0",
            },
        )
    )
    stack.start()
    try:
        await stack.wait_ready(90)
        for k, rate in enumerate(float(r) for r in args.rates.split(",")):
            res = await one_rate(stack, log, rate, args.seconds, args.duration, f"r{k}")
            print(json.dumps(res), flush=True)
    finally:
        stack.stop(servers=False)
        await forget(stack)
        stack.stop_servers()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default="250,500,1000", help="offered arrival rates (jobs/s), comma-separated")
    p.add_argument("--seconds", type=float, default=5.0, help="how long each rate is offered")
    p.add_argument("--duration", type=float, default=0.5, help="run time of each job (s)")
    p.add_argument("--reconfig", type=float, default=0.001, help="simulated reconfiguration latency (s)")
    asyncio.run(main(p.parse_args()))
