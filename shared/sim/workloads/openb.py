"""Loader for the Alibaba cluster-trace-gpu-v2023 ("openb") pod lists.

Mapping (see the trace README and docs/simulator.md):

- arrival = ``creation_time``; run time = ``deletion_time - scheduled_time`` (at full speed, alone);
- pods with ``num_gpu == 0`` (CPU only) and Pending pods that never got a ``scheduled_time`` are dropped and
  counted in ``Workload.dropped``;
- a single-GPU pod asks ``gpu_milli / 1000`` of a GPU: the smallest profile whose compute share c/C and memory
  share m/M both cover it (``profile_for_fraction``), kept as its shape so it resolves on every model;
- ``num_gpu > 1`` is a gang of whole GPUs on one node (``Demand(kind="gpus")``);
- ``qos`` gives the priority (LS and Guaranteed 2, Burstable 1, BE 0) and the tenant; LS is latency-sensitive;
- the trace lists the pods alive in its last 34 days; with ``window="auto"`` the clock starts when that window
  opens, and the 33 pods created earlier arrive at its start with the run time they had left.
"""

from __future__ import annotations

import csv
from pathlib import Path

from shared.mig.geometry import GpuModel
from shared.policy.request import Demand, profile_for_fraction
from shared.sim.errors import WorkloadError
from shared.sim.jobs import SimJob, Workload, sort_jobs
from shared.sim.workloads import catalog

COLUMNS = ("name", "num_gpu", "gpu_milli", "qos", "creation_time", "deletion_time", "scheduled_time")
PRIORITY = {"LS": 2, "Guaranteed": 2, "Burstable": 1, "BE": 0}


def resolve(trace: str) -> Path:
    """A path, or a variant name: ``default``, ``gpushare60``, ``openb_pod_list_default.csv``..."""
    p = Path(trace)
    if p.suffix == ".csv" and p.exists():
        return p
    name = trace if trace.startswith("openb_pod_list_") else f"openb_pod_list_{trace}"
    name = name if name.endswith(".csv") else name + ".csv"
    found = catalog.traces_dir() / catalog.trace("openb").folder / name
    if not found.exists():
        hint = catalog.missing_hint("openb")
        raise WorkloadError(f"openb trace {trace!r} not found (looked for {p} and {found}); {hint}")
    return found


def _wclass(qos: str, num_gpu: int, milli: int) -> str:
    if qos in ("LS", "Guaranteed"):
        return "inference"
    if qos == "Burstable":
        return "interactive"
    return "large-training" if num_gpu > 1 or milli >= 1000 else "small-training"


def load_openb(
    trace: str,
    model: GpuModel,
    *,
    window: str = "auto",
    time_scale: float = 1.0,
    limit: int | None = None,
) -> Workload:
    """Read one openb pod list. ``time_scale`` > 1 compresses the arrival gaps (not the run times) to raise
    the offered load; ``window`` is ``auto`` (start at the observation window), ``all``, or ``START:END`` in trace
    seconds (pods created in it)."""
    path = resolve(trace)
    if time_scale <= 0:
        raise WorkloadError(f"time_scale must be positive, got {time_scale}")
    rows = _rows(path)
    lo, hi = _window(window, rows)
    dropped = {"cpu_only": 0, "never_scheduled": 0, "outside_window": 0}
    jobs: list[SimJob] = []
    shapes: dict[int, str] = {}
    for line, r in enumerate(rows, start=2):
        got = _pod(r, f"{path.name}:{line}", model, shapes, (lo, hi), window == "auto")
        if isinstance(got, str):
            dropped[got] = dropped.get(got, 0) + 1
        else:
            jobs.append(got)
    if not jobs:
        raise WorkloadError(f"{path.name}: no replayable GPU pods")
    ordered = sort_jobs(jobs)
    t0 = ordered[0].arrival
    if time_scale != 1.0:
        ordered = tuple(_rescale(j, t0, time_scale) for j in ordered)
    if limit is not None:
        ordered = ordered[:limit]
    notes = (f"{path.name}: {len(ordered)} GPU pods replayed; dropped {dropped}",)
    return Workload(
        name=f"openb:{path.stem.removeprefix('openb_pod_list_')}",
        jobs=ordered,
        dropped={k: v for k, v in dropped.items() if v},
        notes=notes,
    )


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise WorkloadError(
                f"{path.name} lacks column(s) {', '.join(missing)} (the multigpu* variants have "
                f"no time columns and cannot be replayed)"
            )
        return list(reader)


def _window(window: str, rows: list[dict[str, str]]) -> tuple[float, float]:
    """The creation times replayed: ``auto`` from the observation window's start (the earliest deletion)."""
    if window == "auto":
        return min(float(r["deletion_time"]) for r in rows), float("inf")
    if window == "all":
        return -float("inf"), float("inf")
    try:
        a, _, b = window.partition(":")
        return float(a or "-inf"), float(b or "inf")
    except ValueError:
        raise WorkloadError(f"window {window!r} is not auto, all or START:END") from None


def _pod(r: dict[str, str], where: str, model: GpuModel, shapes: dict[int, str], bounds: tuple[float, float],
         auto: bool) -> SimJob | str:
    """One pod as a job, or why it is dropped. ``auto``: a pod alive when the window opens arrives then with the
    rest of its run; otherwise a pod created outside ``bounds`` is dropped."""
    try:
        num_gpu, milli = int(r["num_gpu"]), int(r["gpu_milli"] or 0)
        if num_gpu == 0:
            return "cpu_only"
        if not r["scheduled_time"]:
            return "never_scheduled"
        created, sched, deleted = float(r["creation_time"]), float(r["scheduled_time"]), float(r["deletion_time"])
    except ValueError as exc:
        raise WorkloadError(f"{where}: {exc}") from None
    lo, hi = bounds
    if not auto and not lo <= created < hi:
        return "outside_window"
    arrival, run = created, deleted - sched
    if auto and created < lo:  # alive when the observation starts: the rest of its run
        arrival, run = lo, deleted - max(sched, lo)
    if run <= 0:
        return "zero_duration"
    if num_gpu > 1:
        demand, shape = Demand(kind="gpus", gpus=num_gpu), "7g"
    else:
        if milli not in shapes:
            shapes[milli] = profile_for_fraction(model, min(max(milli, 1), 1000) / 1000.0).shape
        shape = shapes[milli]
        demand = Demand(kind="mig", profile=shape)
    qos = r["qos"]
    return SimJob(
        id=r["name"],
        arrival=arrival,
        duration=run,
        demand=demand,
        shape=shape,
        tenant=qos or "none",
        priority=PRIORITY.get(qos, 0),
        latency_sensitive=qos == "LS",
        wclass=_wclass(qos, num_gpu, milli),
    )


def _rescale(j: SimJob, t0: float, k: float) -> SimJob:
    import msgspec

    return msgspec.structs.replace(j, arrival=t0 + (j.arrival - t0) / k)
