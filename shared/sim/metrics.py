"""What a run measures: per-job outcomes, the time-weighted utilisation, the fragmentation time series, and
the
KPI object (the stable JSON contract documented in README and docs/simulator.md)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from shared.policy.fragcost import demand_weights, frag_rate_columns
from shared.policy.snapshot import GpuView
from shared.sim.classes import ClassKpis, class_kpis, gpu_equivalents
from shared.sim.jobs import SimJob
from shared.sim.stats import pct, rounded

if TYPE_CHECKING:
    from shared.sim.run import SimRun

KPI_VERSION = 1


class TenantKpis(msgspec.Struct, frozen=True, kw_only=True):
    jobs: int
    completed: int
    rejected: int
    wait_mean_s: float
    usage_slice_h: float
    """Compute slices held x hours while running."""
    # with tenancy (shared/sim/tenancy.py); 0 without
    wait_p50_s: float = 0.0
    wait_p95_s: float = 0.0
    wait_max_s: float = 0.0
    quota_held_s: float = 0.0
    """Seconds its jobs waited with reason "quota" (over their quota), summed."""
    preempted: int = 0
    lost_work_s: float = 0.0
    book_slice_h: float = 0.0
    """Compute slices charged in the quota book x hours."""
    book_gib_h: float = 0.0
    borrowed_slice_h: float = 0.0
    """Compute slices above its nominal quota (borrowed in its cohort) x hours."""
    peak_slices: float = 0.0


class Kpis(msgspec.Struct, frozen=True, kw_only=True):
    """One policy run. Fields only grow; ``wall_s`` is the only field that differs between identical runs."""

    v: int = KPI_VERSION
    policy: str
    workload: str
    cluster: str
    gpus: int
    seed: int
    threshold: float
    jobs: int
    completed: int
    rejected: int
    rejection_rate: float
    rejection_rate_peak: float
    jct_mean_s: float
    jct_p50_s: float
    jct_p95_s: float
    jct_p99_s: float
    wait_mean_s: float
    wait_p95_s: float
    makespan_s: float
    utilization: float
    frag_rate_mean: float
    frag_rate_peak: float
    frag_rate_p95: float
    reconfigurations: int
    migrations: int
    migrated_share: float
    moves_skipped: int
    jobs_per_day: float
    stretch_mean: float
    """Mean of (run time / duration at full speed) over completed jobs: interference plus migration costs."""
    events: int
    wall_s: float
    tenants: dict[str, TenantKpis] = {}
    preemptions: int = 0
    """Jobs preempted (tenancy runs; each re-queued with its arrival time)."""
    lost_work_s: float = 0.0
    """Run time lost by preempted jobs (progress since their last checkpoint)."""
    holds: dict[str, int] = {}
    """Queue passes that held a job, per reason (quota | capacity | reserved capacity)."""
    rejected_gpu_h: float = 0.0
    """GPU-hours (of 7 compute slices, at full speed) that the rejected jobs asked for: rejected work, which
    weighs an 8-GPU job as eight GPUs where ``rejected`` counts it as one job."""
    classes: dict[str, ClassKpis] = {}
    """Per demand class (``demand_class``): jobs, rejections, waits and rejected GPU-hours."""
    reserved_idle_gpu_h: float = 0.0
    """GPU-hours that reservations held idle (slices kept free for a waiting job; policies with
    reservations)."""
    refused: dict[str, int] = {}
    """Jobs rejected on arrival, per reason, because no set of nodes in the cluster could ever host them (they
    are in ``rejected`` too)."""


class Series(msgspec.Struct, frozen=True, kw_only=True):
    t: list[float]
    utilization: list[float]
    frag_rate: list[float]
    queued: list[int]


class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    kpis: Kpis
    series: Series
    jct: list[float]
    """Completion times of completed jobs, sorted (for the CDF)."""


class Outcome:
    """Per-job times as the run goes (nan = did not happen)."""

    __slots__ = ("completed", "ended", "finish", "live", "lost", "migrations", "placed_at", "start", "token")

    def __init__(self, n: int) -> None:
        self.placed_at = [math.nan] * n
        self.start = [math.nan] * n
        self.finish = [math.nan] * n
        self.completed = [False] * n
        self.lost = [0.0] * n
        self.migrations = [0] * n
        self.live = 0
        self.ended = 0
        self.token = 0

    def placed(self, i: int, t: float) -> None:
        self.placed_at[i] = t

    def started(self, i: int, t: float) -> None:
        if math.isnan(self.start[i]):
            self.start[i] = t

    def _end(self, i: int, t: float) -> None:
        if not math.isnan(self.finish[i]):
            from shared.sim.errors import InvariantError

            raise InvariantError(f"job #{i} ended twice (at {self.finish[i]} and {t})")
        self.finish[i] = t
        self.live -= 1
        self.ended += 1

    def complete(self, i: int, t: float) -> None:
        self._end(i, t)
        self.completed[i] = True

    def reject(self, i: int, t: float) -> None:
        self._end(i, t)


class Recorder:
    """Integrates utilisation between events and samples the time series on a fixed virtual-time grid."""

    def __init__(self, sim: SimRun, samples: int) -> None:
        self.sim = sim
        jobs = sim.jobs
        self.t0 = jobs[0].arrival if jobs else 0.0
        self.t_prev = self.t0
        span = (jobs[-1].arrival - self.t0) if jobs else 0.0
        durs = sorted(j.duration for j in jobs)
        tail = durs[int(0.95 * (len(durs) - 1))] if durs else 0.0
        self.interval = max((span + tail) / max(1, samples), 1e-3)
        self.next_sample = self.t0
        self.area = 0.0
        self.weights = demand_weights(sim.workload.shapes()) if jobs else {}
        self.t: list[float] = []
        self.util: list[float] = []
        self.frag: list[float] = []
        self.queued: list[int] = []
        self._frag_cache: tuple[int, float] = (-1, 0.0)
        self._static_cache: dict[str, tuple[GpuView, float, float]] = {}

    def advance(self, t: float) -> None:
        if t <= self.t_prev:
            return
        cl = self.sim.cluster
        self.area += cl.used * (t - self.t_prev)
        while self.next_sample <= t:
            self._sample(self.next_sample)
            self.next_sample += self.interval
        self.t_prev = t

    def _sample(self, t: float) -> None:
        cl = self.sim.cluster
        if self._frag_cache[0] != cl.changes:
            rate = (
                frag_rate_columns(cl.model_list, cl.model_idx, cl.busy, cl.usable, self.weights)
                if self.sim.spec.repartitions else self._static_frag()
            )
            self._frag_cache = (cl.changes, rate)
        self.t.append(rounded(t - self.t0))
        self.util.append(rounded(cl.used / cl.capacity))
        self.frag.append(rounded(self._frag_cache[1]))
        self.queued.append(len(self.sim.queue))

    def _static_frag(self) -> float:
        """The fragmentation rate of a cluster that never repartitions.

        A free slice is usable by a shape only inside an idle instance that can host it (the whole instance is
        then taken); slices outside every instance are usable by nobody. Otherwise the same definition as
        ``frag_rate``: the demand-weighted share of free slices the mix cannot use. (``frag_rate`` treats idle
        instances as reclaimable, which a static cluster cannot do.)"""
        cl = self.sim.cluster
        free = unusable = 0.0
        for gpu in cl.views.values():
            hit = self._static_cache.get(gpu.id)
            if hit is None or hit[0] is not gpu:
                hit = (gpu, *self._static_gpu(gpu))
                self._static_cache[gpu.id] = hit
            free += hit[1]
            unusable += hit[2]
        return min(1.0, unusable / free) if free > 0 else 0.0

    def _static_gpu(self, gpu: GpuView) -> tuple[float, float]:
        model = self.sim.cluster.models[gpu.id]
        placed = 0
        for inst in gpu.instances:
            placed |= inst.mask
        idle = [model.profile(i.profile) for i in gpu.instances if not i.busy]
        free = sum(p.memory_slices for p in idle) + model.memory_slices - placed.bit_count()
        if free == 0:
            return 0.0, 0.0
        unusable = 0.0
        for shape, w in self.weights.items():
            want = next((p for p in model.profiles if p.shape == shape), None)
            usable = 0
            if want is not None:
                usable = sum(
                    p.memory_slices
                    for p in idle
                    if p.compute_slices >= want.compute_slices and p.memory_slices >= want.memory_slices
                )
            unusable += w * (free - usable)
        return float(free), unusable

    def result(self, wall_s: float) -> RunResult:
        sim, out = self.sim, self.sim.out
        jobs = sim.jobs
        n = len(jobs)
        arrival = np.array([j.arrival for j in jobs], dtype=np.float64)
        finish = np.array(out.finish, dtype=np.float64)
        start = np.array(out.start, dtype=np.float64)
        done = np.array(out.completed, dtype=bool)
        jct = np.sort(finish[done] - arrival[done])
        wait = start[done] - arrival[done]
        end = float(np.nanmax(finish)) if n else self.t0
        makespan = max(0.0, end - self.t0)
        self.advance(end)
        dur = np.array([j.duration for j in jobs], dtype=np.float64)
        gpu_eq = np.array([gpu_equivalents(j) for j in jobs], dtype=np.float64)
        wait_all = start - arrival
        stretch = (finish[done] - start[done]) / np.maximum(dur[done], 1e-9)
        rejected = int(n - done.sum())
        migrated = sum(1 for m in out.migrations if m > 0)
        cfg = sim.cfg
        k = Kpis(
            policy=sim.spec.name,
            workload=sim.workload.name,
            cluster=sim.cluster.spec.label(),
            gpus=sim.cluster.spec.gpu_count,
            seed=cfg.seed,
            threshold=cfg.threshold,
            jobs=n,
            completed=int(done.sum()),
            rejected=rejected,
            rejection_rate=rounded(rejected / n if n else 0.0),
            rejection_rate_peak=rounded(self._peak_rejection(arrival, done)),
            jct_mean_s=rounded(jct.mean() if jct.size else 0.0),
            jct_p50_s=rounded(pct(jct, 50)),
            jct_p95_s=rounded(pct(jct, 95)),
            jct_p99_s=rounded(pct(jct, 99)),
            wait_mean_s=rounded(wait.mean() if wait.size else 0.0),
            wait_p95_s=rounded(pct(wait, 95)),
            makespan_s=rounded(makespan),
            utilization=rounded(self.area / (sim.cluster.capacity * makespan) if makespan > 0 else 0.0),
            frag_rate_mean=rounded(float(np.mean(self.frag)) if self.frag else 0.0),
            frag_rate_peak=rounded(max(self.frag, default=0.0)),
            frag_rate_p95=rounded(pct(np.array(self.frag), 95)),
            reconfigurations=sim.cluster.reconfigurations,
            migrations=sum(out.migrations),
            migrated_share=rounded(migrated / n if n else 0.0),
            moves_skipped=sim.moves_skipped,
            jobs_per_day=rounded(done.sum() / (makespan / 86400.0) if makespan > 0 else 0.0),
            stretch_mean=rounded(stretch.mean() if stretch.size else 1.0),
            events=sim.events,
            wall_s=round(wall_s, 3),
            tenants=self._tenants(start, finish, done, arrival),
            rejected_gpu_h=rounded(float((gpu_eq * dur)[~done].sum()) / 3600.0 if n else 0.0),
            classes=class_kpis(jobs, done, wait_all, gpu_eq * dur),
            reserved_idle_gpu_h=rounded(getattr(sim, "reserved_idle_s", 0.0) / 3600.0),
            refused=dict(getattr(sim, "refused", {})),
        )
        series = Series(t=self.t, utilization=self.util, frag_rate=self.frag, queued=self.queued)
        return RunResult(kpis=k, series=series, jct=[rounded(x) for x in jct])

    def _peak_rejection(self, arrival: np.ndarray, done: np.ndarray) -> float:
        """Rejection rate among jobs arriving in the busiest 10 % of 100 equal arrival windows, busiest by the
        compute-slice-seconds requested. Depends only on the workload, so every policy is judged on the same
        windows."""
        n = arrival.size
        if n == 0:
            return 0.0
        span = arrival[-1] - arrival[0]
        if span <= 0:
            return float((~done).mean())
        jobs = self.sim.jobs
        ask = np.array([self._slices(j) * j.duration for j in jobs], dtype=np.float64)
        win = np.minimum(((arrival - arrival[0]) / span * 100).astype(np.int64), 99)
        offered = np.bincount(win, weights=ask, minlength=100)
        top = np.argsort(-offered, kind="stable")[:10]
        sel = np.isin(win, top)
        return float((~done[sel]).mean()) if sel.any() else 0.0

    def _slices(self, job: SimJob) -> int:
        if job.demand.kind == "gpus":
            return 7 * job.demand.gpus
        return int(job.shape[0]) if job.shape[:1].isdigit() else 7

    def _tenants(
        self, start: np.ndarray, finish: np.ndarray, done: np.ndarray, arrival: np.ndarray
    ) -> dict[str, TenantKpis]:
        acc: dict[str, list[float]] = {}
        # Python floats, not numpy scalars: the same float64 arithmetic, without a numpy scalar per read
        starts, finishes, dones, arrivals = start.tolist(), finish.tolist(), done.tolist(), arrival.tolist()
        for i, j in enumerate(self.sim.jobs):
            a = acc.get(j.tenant)
            if a is None:
                a = acc[j.tenant] = [0, 0, 0, 0.0, 0.0]
            a[0] += 1
            if dones[i]:
                a[1] += 1
                a[3] += starts[i] - arrivals[i]
                a[4] += self._slices(j) * (finishes[i] - starts[i]) / 3600.0
            else:
                a[2] += 1
        return {
            t: TenantKpis(
                jobs=int(a[0]),
                completed=int(a[1]),
                rejected=int(a[2]),
                wait_mean_s=rounded(a[3] / a[1] if a[1] else 0.0),
                usage_slice_h=rounded(a[4]),
            )
            for t, a in sorted(acc.items())
        }
