"""The ``fluid`` reference: the cluster as one pool of compute and memory slices, so nothing fragments.

Not a policy a cluster could run: a job needs only that the pool holds its profile's compute and memory slices
(a k-GPU job needs k full-size profiles' worth), wherever they are. It keeps everything else of a run: arrival
order, the queue in priority-then-age order with greedy backfill over ``backfill_depth`` entries, and each job's
patience. Jobs run at full speed (no interference, no reconfiguration latency), so the bound is optimistic on
both counts. What a real policy loses against it is what fragmentation and slice geometry cost; the matrix
reports what share of the gap between the best baseline and this bound a policy closes.

The demand of every job is resolved on the first node's GPU model (the pool has one exchange rate).
"""

from __future__ import annotations

import bisect
import heapq
import math
import time

import numpy as np

from shared.mig.geometry import Geometry, Profile, default_geometry
from shared.policy.request import full_profile, resolve_profile
from shared.sim.classes import class_kpis, gpu_equivalents
from shared.sim.cluster_spec import ClusterSpec
from shared.sim.config import SimConfig
from shared.sim.errors import WorkloadError
from shared.sim.jobs import SimJob, Workload
from shared.sim.metrics import Kpis, RunResult, Series

NAME = "fluid"


def _need(job: SimJob, geometry: Geometry, model_name: str) -> tuple[int, int]:
    """(compute slices, memory slices) the job takes from the pool."""
    model = geometry.model(model_name)
    if job.demand.kind == "gpus":
        full = full_profile(model)
        return job.demand.gpus * full.compute_slices, job.demand.gpus * full.memory_slices
    if job.demand.kind == "shared":
        return 1, 1
    prof: Profile | None = resolve_profile(job.demand, model)
    if prof is None:
        raise WorkloadError(f"job {job.id}: {model_name} has no profile for {job.demand.label()}")
    return prof.compute_slices, prof.memory_slices


def run_fluid(
    workload: Workload, cluster: ClusterSpec, cfg: SimConfig, geometry: Geometry | None = None
) -> RunResult:
    """Replay ``workload`` on the pooled cluster; the KPIs that need slice geometry (fragmentation,
    reconfigurations, migrations) are zero."""
    wall0 = time.perf_counter()
    geo = geometry or default_geometry()
    jobs = workload.jobs
    n = len(jobs)
    model_name = cluster.nodes[0].model
    cap_c = sum(nd.gpus * geo.model(nd.model).compute_slices for nd in cluster.nodes)
    cap_m = sum(nd.gpus * geo.model(nd.model).memory_slices for nd in cluster.nodes)
    need = [_need(j, geo, model_name) for j in jobs]
    free_c, free_m = cap_c, cap_m
    start = [math.nan] * n
    finish = [math.nan] * n
    done = [False] * n
    deadline = [
        j.arrival + (j.patience if j.patience is not None else cfg.patience_s) for j in jobs
    ]
    queue: list[tuple[int, float, int]] = []
    exits: list[tuple[float, int]] = []
    area = 0.0
    t_prev = jobs[0].arrival if n else 0.0
    nxt = 0
    events = 0
    while nxt < n or exits or queue:
        t_arr = jobs[nxt].arrival if nxt < n else math.inf
        t_exit = exits[0][0] if exits else math.inf
        t_out = min((deadline[k[2]] for k in queue), default=math.inf)
        t = min(t_arr, t_exit, t_out)
        if t == math.inf:
            break
        area += (cap_c - free_c) * (t - t_prev)
        t_prev = t
        events += 1
        if t_exit <= t_arr and t_exit <= t_out:
            _, i = heapq.heappop(exits)
            free_c += need[i][0]
            free_m += need[i][1]
            finish[i] = t
            done[i] = True
        elif t_out < t_arr:
            for k in [k for k in queue if deadline[k[2]] <= t]:
                queue.remove(k)
                finish[k[2]] = t
            continue
        else:
            job = jobs[nxt]
            bisect.insort(queue, (-job.priority, job.arrival, nxt))
            nxt += 1
        placed: list[tuple[int, float, int]] = []
        for key in queue[: cfg.backfill_depth]:
            i = key[2]
            c, m = need[i]
            if c <= free_c and m <= free_m:
                free_c -= c
                free_m -= m
                start[i] = t
                heapq.heappush(exits, (t + jobs[i].duration, i))
                placed.append(key)
        for key in placed:
            queue.remove(key)
    return _result(workload, cluster, cfg, start, finish, done, area, cap_c, events, time.perf_counter() - wall0)


def _result(
    workload: Workload, cluster: ClusterSpec, cfg: SimConfig, start: list[float], finish: list[float],
    done_l: list[bool], area: float, cap_c: int, events: int, wall_s: float,
) -> RunResult:
    jobs = workload.jobs
    n = len(jobs)
    arrival = np.array([j.arrival for j in jobs], dtype=np.float64)
    st = np.array(start, dtype=np.float64)
    fin = np.array(finish, dtype=np.float64)
    done = np.array(done_l, dtype=bool)
    jct = np.sort(fin[done] - arrival[done])
    wait = st[done] - arrival[done]
    t0 = float(arrival[0]) if n else 0.0
    makespan = max(0.0, float(np.nanmax(fin)) - t0) if n else 0.0
    dur = np.array([j.duration for j in jobs], dtype=np.float64)
    work = np.array([gpu_equivalents(j) for j in jobs], dtype=np.float64) * dur
    rejected = int(n - done.sum())

    def r(x: float) -> float:
        return round(float(x), 6)

    def pct(a: np.ndarray, q: float) -> float:
        return r(np.percentile(a, q)) if a.size else 0.0

    kpis = Kpis(
        policy=NAME, workload=workload.name, cluster=cluster.label(), gpus=cluster.gpu_count, seed=cfg.seed,
        threshold=cfg.threshold, jobs=n, completed=int(done.sum()), rejected=rejected,
        rejection_rate=r(rejected / n if n else 0.0), rejection_rate_peak=0.0,
        jct_mean_s=r(jct.mean() if jct.size else 0.0), jct_p50_s=pct(jct, 50), jct_p95_s=pct(jct, 95),
        jct_p99_s=pct(jct, 99), wait_mean_s=r(wait.mean() if wait.size else 0.0), wait_p95_s=pct(wait, 95),
        makespan_s=r(makespan), utilization=r(area / (cap_c * makespan) if makespan > 0 else 0.0),
        frag_rate_mean=0.0, frag_rate_peak=0.0, frag_rate_p95=0.0, reconfigurations=0, migrations=0,
        migrated_share=0.0, moves_skipped=0,
        jobs_per_day=r(done.sum() / (makespan / 86400.0) if makespan > 0 else 0.0), stretch_mean=1.0,
        events=events, wall_s=round(wall_s, 3),
        rejected_gpu_h=r(float(work[~done].sum()) / 3600.0),
        classes=class_kpis(jobs, done, st - arrival, work),
    )
    series = Series(t=[], utilization=[], frag_rate=[], queued=[])
    return RunResult(kpis=kpis, series=series, jct=[r(x) for x in jct])
