"""KPIs of a replay through the live stack, with the simulator's keys, read back from the state store.

Times come from each job's transition history in Redis (``submitted_at`` of its spec, the first transition to
``running``, the transition to ``finished``) and are multiplied by the replay's speed-up, so they are in trace
seconds like the simulator's. The fragmentation rate and utilisation are sampled from Redis while the replay
runs (``Sampler``); reconfigurations are the executors' own counters (Prometheus).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import urllib.request
from collections.abc import Iterable, Mapping

import msgspec
import numpy as np

from migsched.replayer import Replay
from shared.mig.geometry import Geometry, GpuModel
from shared.policy.fragcost import demand_weights, frag_rate
from shared.policy.request import Demand, resolve_profile
from shared.sim.classes import class_gpus
from shared.sim.jobs import Workload
from shared.sim.metrics import Kpis
from shared.state import RedisState
from shared.state.codec import decode_job, history_raw

KPI_KEYS = (
    "jobs",
    "completed",
    "rejected",
    "rejection_rate",
    "jct_mean_s",
    "jct_p50_s",
    "jct_p95_s",
    "jct_p99_s",
    "wait_mean_s",
    "makespan_s",
    "utilization",
    "frag_rate_mean",
    "frag_rate_peak",
    "reconfigurations",
    "migrations",
    "migrated_share",
    "events",
    "wall_s",
)
GANG_KEYS = ("gangs", "gangs_completed", "gang_wait_mean_s")
"""The jobs of two whole GPUs or more: how many, how many finished, their mean wait (in a replay's KPIs and the
simulator's alike)."""


class JobOutcome(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    state: str
    submitted: float
    started: float = math.nan
    finished: float = math.nan
    migrations: int = 0
    transitions: int = 0


class Sample(msgspec.Struct, frozen=True, kw_only=True):
    at: float
    frag_rate: float
    utilization: float
    busy_slices: int


class Sampler:
    """Samples the fragmentation rate and utilisation from Redis every ``every_s`` until stopped."""

    def __init__(
        self, state: RedisState, geometry: Geometry, workload: Workload, every_s: float = 0.25
    ) -> None:
        self.state, self.geometry, self.every_s = state, geometry, every_s
        self.weights = demand_weights(workload.shapes())
        self.samples: list[Sample] = []
        self._stop = asyncio.Event()

    async def sample(self) -> Sample:
        snap, _ = await self.state.snapshot(self.geometry)
        gpus = snap.gpus
        cap = sum(self.geometry.model(g.model).compute_slices for g in gpus) or 1
        s = Sample(
            at=time.time(),
            frag_rate=frag_rate(snap, self.weights) if gpus else 0.0,
            utilization=sum(g.used_compute for g in gpus) / cap,
            busy_slices=sum(bin(g.busy_mask).count("1") for g in gpus),
        )
        self.samples.append(s)
        return s

    async def run(self) -> None:
        while not self._stop.is_set():
            await self.sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.every_s)

    def stop(self) -> None:
        self._stop.set()


async def outcomes(state: RedisState, job_ids: Iterable[str]) -> dict[str, JobOutcome | None]:
    ids = list(job_ids)
    await state.locate_jobs(ids)
    pipe = state.redis.pipeline(transaction=False)
    for j in ids:
        pipe.hgetall(state.job_keys(j).job(j))
        pipe.lrange(state.job_keys(j).hist(j), 0, -1)  # an older version's history
    res = await pipe.execute()
    out: dict[str, JobOutcome | None] = {}
    for n, j in enumerate(ids):
        h, legacy = res[2 * n], res[2 * n + 1]
        rec = decode_job(j, h)
        if rec is None:
            out[j] = None
            continue
        started = finished = math.nan
        migrations = 0
        hist = [msgspec.json.decode(x) for x in history_raw(h, legacy)]
        for h in hist:
            to, prev = h.get("to"), h.get("from")
            if to == "running" and math.isnan(started):
                started = float(h["at"])
            if to == "running" and prev == "migrating":
                migrations += 1
            if to == "finished":
                finished = float(h["at"])
        submitted = float(rec.at) if rec.at else math.nan
        if rec.spec:
            submitted = float(msgspec.json.decode(rec.spec).get("submitted_at", submitted))
        out[j] = JobOutcome(
            job_id=j,
            state=rec.state,
            submitted=submitted,
            started=started,
            finished=finished,
            migrations=migrations,
            transitions=len(hist),
        )
    return out


def scrape(port: int, metric: str) -> float:
    """Sum of one counter over its label sets on a local Prometheus endpoint (0 when unreachable)."""
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return 0.0
    total = 0.0
    for line in body.splitlines():
        if line.startswith(metric + "{") or line.startswith(metric + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _compute_slices(demand: Demand, model: GpuModel) -> int:
    """The compute slices a job holds while it runs: its instance's, or every GPU of a gang."""
    if demand.kind == "gpus":
        return demand.gpus * model.compute_slices
    prof = resolve_profile(demand, model)
    return prof.compute_slices if prof else model.compute_slices


def kpis(
    workload: Workload,
    replay: Replay,
    jobs: Mapping[str, JobOutcome | None],
    samples: list[Sample],
    geometry: Geometry,
    model: str,
    gpus: int,
    *,
    prefix: str = "",
    reconfigurations: int = 0,
    wall_s: float = 0.0,
) -> dict[str, float | int]:
    s = replay.speedup
    m = geometry.model(model)
    n = len(workload.jobs)
    arrival, start, finish, done, compute = [], [], [], [], []
    migrations = migrated = rejected = transitions = 0
    for job in workload.jobs:
        o = jobs.get(prefix + job.id)
        compute.append(_compute_slices(job.demand, m))
        if o is None:
            o = JobOutcome(job_id=prefix + job.id, state="missing", submitted=math.nan)
        arrival.append(o.submitted)
        start.append(o.started)
        finish.append(o.finished)
        done.append(o.state == "finished")
        rejected += o.state != "finished"
        migrations += o.migrations
        transitions += o.transitions
        migrated += o.migrations > 0
    a, st, f = np.array(arrival), np.array(start), np.array(finish)
    d = np.array(done, dtype=bool)
    c = np.array(compute, dtype=np.float64)
    jct = (f[d] - a[d]) * s
    wait = (st[d] - a[d]) * s
    t_first = replay.started_at
    end = float(np.nanmax(f)) if d.any() else t_first
    makespan = max(0.0, end - t_first) * s
    busy = float(np.nansum(c[d] * (f[d] - st[d]))) * s
    capacity = gpus * m.compute_slices
    fr = [x.frag_rate for x in samples]
    gang = np.array([j.demand.kind == "gpus" and j.demand.gpus > 1 for j in workload.jobs], dtype=bool)
    gang_wait = (st[d & gang] - a[d & gang]) * s

    def pct(x: np.ndarray, q: float) -> float:
        return round(float(np.percentile(x, q)), 6) if x.size else 0.0

    return {
        "jobs": n,
        "completed": int(d.sum()),
        "rejected": rejected,
        "rejection_rate": round(rejected / n, 6) if n else 0.0,
        "jct_mean_s": round(float(jct.mean()), 6) if jct.size else 0.0,
        "jct_p50_s": pct(jct, 50),
        "jct_p95_s": pct(jct, 95),
        "jct_p99_s": pct(jct, 99),
        "wait_mean_s": round(float(wait.mean()), 6) if wait.size else 0.0,
        "makespan_s": round(makespan, 6),
        "utilization": round(busy / (capacity * makespan), 6) if makespan > 0 else 0.0,
        "frag_rate_mean": round(float(np.mean(fr)), 6) if fr else 0.0,
        "frag_rate_peak": round(max(fr, default=0.0), 6),
        "reconfigurations": reconfigurations,
        "migrations": migrations,
        "migrated_share": round(migrated / n, 6) if n else 0.0,
        "events": transitions,
        "wall_s": round(wall_s, 3),
        "gangs": int(gang.sum()),
        "gangs_completed": int((d & gang).sum()),
        "gang_wait_mean_s": round(float(gang_wait.mean()), 6) if gang_wait.size else 0.0,
    }


def simulated_run(
    workload: Workload,
    nodes: int,
    gpus_per_node: int,
    model: str,
    *,
    threshold: float = 0.4,
    reconfig_latency_s: float = 0.15,
    seed: int = 0,
) -> Kpis:
    """The simulator's run of the same workload, cluster and policy as a live replay. Interference, migration
    downtime and checkpoint loss are off: the sim executors model none of them."""
    from shared.sim.cluster import ClusterSpec, NodeSpec
    from shared.sim.config import InterferenceParams, SimConfig
    from shared.sim.experiment import run_one

    cluster = ClusterSpec(
        nodes=tuple(NodeSpec(name=f"gpu-node-{i}", model=model, gpus=gpus_per_node) for i in range(nodes))
    )
    cfg = SimConfig(
        seed=seed,
        threshold=threshold,
        reconfig_latency_s=reconfig_latency_s,
        migration_downtime_s=0.0,
        checkpoint_s=0.0,
        interference=InterferenceParams(beta=0.0),
    )
    # the live balancer runs the default policy, holds for waiting large jobs included, on the replay's clock
    return run_one(workload, cluster, "migsched", cfg).kpis


def comparable(k: Kpis) -> dict[str, float | int]:
    """The KPIs of a simulated run that a live replay's are compared with (``KPI_KEYS``, ``GANG_KEYS``)."""
    b = msgspec.to_builtins(k)
    gangs = [c for name, c in k.classes.items() if class_gpus(name) > 1]
    placed = sum(c.jobs - c.rejected for c in gangs)
    waited = sum(c.wait_mean_s * (c.jobs - c.rejected) for c in gangs)
    return {**{key: b[key] for key in KPI_KEYS}, "gangs": sum(c.jobs for c in gangs), "gangs_completed": placed,
            "gang_wait_mean_s": round(waited / placed, 6) if placed else 0.0}


def simulate(workload: Workload, nodes: int, gpus_per_node: int, model: str) -> dict[str, float | int]:
    """``comparable`` of ``simulated_run``."""
    return comparable(simulated_run(workload, nodes, gpus_per_node, model))
