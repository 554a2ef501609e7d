"""Any CSV trace, replayed without code: a column mapping says which column means what.

Mapping keys (``key=column`` pairs, e.g. ``arrival=submit_ts,duration=runtime,gpu_fraction=gpu,tenant=user``):

- time: ``arrival`` (absolute) or ``gap`` (inter-arrival time) -- exactly one;
- run time: ``duration``, or ``end`` (absolute end time, with ``arrival``);
- demand -- exactly one: ``gpu_fraction`` (share of one GPU; > 1 means ceil(f) whole GPUs), ``gpus`` (whole-GPU
  count) or ``profile`` (a MIG profile name such as ``3g.20gb`` or a shape such as ``3g``);
- ``workers``: how many workers the job runs, each with that demand, as in traces of distributed training that
  give GPUs per worker and a worker count. More than one worker makes a gang of whole GPUs (ceil of each
  worker's GPUs, times the workers): a gang's members are whole GPUs, so it goes with ``gpus`` or
  ``gpu_fraction``, not ``profile``;
- optional: ``id``, ``tenant``, ``priority`` (an integer, or high/medium/low, LS/Burstable/BE, HP/Spot),
  ``latency_sensitive`` (true/false/1/0/yes/no), ``class`` (interference class), ``patience`` (seconds);
- pseudo-key ``time_unit=s|ms|min|h`` scales every time column to seconds (default s).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path

from shared.errors import MigschedError
from shared.mig.geometry import GpuModel
from shared.policy.request import MAX_GANG, Demand, profile_for_fraction, resolve_profile
from shared.sim.errors import WorkloadError
from shared.sim.jobs import SimJob, Workload, sort_jobs

KEYS = {
    "arrival",
    "gap",
    "duration",
    "end",
    "gpu_fraction",
    "gpus",
    "profile",
    "workers",
    "id",
    "tenant",
    "priority",
    "latency_sensitive",
    "class",
    "patience",
    "time_unit",
}
UNITS = {"s": 1.0, "ms": 0.001, "min": 60.0, "h": 3600.0}
NAMED_PRIORITY = {
    "high": 2,
    "medium": 1,
    "mid": 1,
    "low": 0,
    "ls": 2,
    "guaranteed": 2,
    "burstable": 1,
    "be": 0,
    "hp": 2,
    "spot": 0,
}
TRUE = {"1", "true", "yes", "y", "t"}
FALSE = {"0", "false", "no", "n", "f", ""}


def parse_mapping(text: str) -> dict[str, str]:
    """``"arrival=submit_ts,duration=runtime"`` -> ``{"arrival": "submit_ts", "duration": "runtime"}``,
    checked."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, col = part.partition("=")
        key, col = key.strip(), col.strip()
        if not sep or not key or not col:
            raise WorkloadError(f"--csv-map entry {part!r} is not key=column")
        if key not in KEYS:
            raise WorkloadError(f"--csv-map key {key!r} is unknown; keys: {', '.join(sorted(KEYS))}")
        if key in out:
            raise WorkloadError(f"--csv-map gives {key!r} twice")
        out[key] = col
    _check(out)
    return out


def _check(m: Mapping[str, str]) -> None:
    if ("arrival" in m) == ("gap" in m):
        raise WorkloadError("--csv-map needs exactly one of arrival=COLUMN or gap=COLUMN")
    if ("duration" in m) == ("end" in m):
        raise WorkloadError("--csv-map needs exactly one of duration=COLUMN or end=COLUMN")
    if "end" in m and "arrival" not in m:
        raise WorkloadError("--csv-map end=COLUMN needs arrival=COLUMN (an end time is absolute)")
    demand = [k for k in ("gpu_fraction", "gpus", "profile") if k in m]
    if len(demand) != 1:
        raise WorkloadError("--csv-map needs exactly one demand: gpu_fraction=, gpus= or profile=COLUMN")
    if "workers" in m and "profile" in m:
        raise WorkloadError("--csv-map workers=COLUMN goes with gpus= or gpu_fraction=: a gang's members are whole "
                            "GPUs, not MIG profiles")
    if m.get("time_unit", "s") not in UNITS:
        raise WorkloadError(f"time_unit must be one of {', '.join(UNITS)}, got {m['time_unit']!r}")


def _num(value: str, what: str, where: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise WorkloadError(f"{where}: {what} {value!r} is not a number") from None
    if math.isnan(x) or math.isinf(x):
        raise WorkloadError(f"{where}: {what} {value!r} is not finite")
    return x


def _priority(value: str, where: str) -> int:
    try:
        return int(float(value))
    except ValueError:
        named = NAMED_PRIORITY.get(value.strip().lower())
        if named is None:
            raise WorkloadError(
                f"{where}: priority {value!r} is neither an integer nor one of {', '.join(NAMED_PRIORITY)}"
            ) from None
        return named


def _demand(m: Mapping[str, str], row: Mapping[str, str], model: GpuModel, where: str) -> tuple[Demand, str]:
    workers = _workers(m, row, where)
    if workers > 1:  # a gang of whole GPUs: each worker's share rounded up to whole GPUs
        key = "gpus" if "gpus" in m else "gpu_fraction"
        per = _num(row[m[key]], key, where)
        if per <= 0 or (key == "gpus" and per != int(per)):
            raise WorkloadError(f"{where}: {key} {row[m[key]]!r} per worker is not a positive "
                                f"{'integer' if key == 'gpus' else 'number'}")
        total = workers * math.ceil(per - 1e-9)
        return _gang(total, f"{workers} workers of {per:g} GPUs ({total} GPUs)", where), "7g"
    if "gpus" in m:
        n = _num(row[m["gpus"]], "gpus", where)
        if n < 1 or n != int(n):
            raise WorkloadError(f"{where}: gpus {row[m['gpus']]!r} is not a positive integer")
        return _gang(int(n), f"gpus {int(n)}", where), "7g"
    if "profile" in m:
        name = row[m["profile"]].strip()
        try:
            prof = resolve_profile(Demand(kind="mig", profile=name), model)
        except MigschedError as exc:
            raise WorkloadError(f"{where}: {exc}") from None
        if prof is None:
            raise WorkloadError(f"{where}: profile {name!r} does not exist on {model.name}")
        return Demand(kind="mig", profile=prof.shape), prof.shape
    f = _num(row[m["gpu_fraction"]], "gpu_fraction", where)
    if f <= 0:
        raise WorkloadError(f"{where}: gpu_fraction {f} must be positive")
    if f > 1:
        return _gang(math.ceil(f - 1e-9), f"gpu_fraction {f:g}", where), "7g"
    shape = profile_for_fraction(model, f).shape
    return Demand(kind="mig", profile=shape), shape


def _workers(m: Mapping[str, str], row: Mapping[str, str], where: str) -> int:
    if "workers" not in m:
        return 1
    w = _num(row[m["workers"]], "workers", where)
    if w < 1 or w != int(w):
        raise WorkloadError(f"{where}: workers {row[m['workers']]!r} is not a positive integer")
    return int(w)


def _gang(n: int, what: str, where: str) -> Demand:
    """``n`` whole GPUs (``what`` the row asked, for the error): one full-size instance for one, else a gang."""
    if n > MAX_GANG:
        raise WorkloadError(f"{where}: {what} is more than one job may ask for ({MAX_GANG} GPUs)")
    return Demand(kind="gpus", gpus=n) if n > 1 else Demand(kind="mig", profile="7g")


def load_csv(
    path: str | Path,
    mapping: Mapping[str, str] | str,
    model: GpuModel,
    *,
    name: str | None = None,
    default_class: str = "small-training",
) -> Workload:
    """Read ``path`` with ``mapping``; rows with a non-positive run time are dropped and counted."""
    m = parse_mapping(mapping) if isinstance(mapping, str) else dict(mapping)
    _check(m)
    p = Path(path)
    unit = UNITS[m.get("time_unit", "s")]
    try:
        with p.open(newline="") as fh:
            reader = csv.DictReader(fh)
            cols = set(reader.fieldnames or ())
            missing = sorted({c for k, c in m.items() if k != "time_unit"} - cols)
            if missing:
                raise WorkloadError(
                    f"{p.name} lacks mapped column(s) {', '.join(missing)}; "
                    f"it has {', '.join(sorted(cols)) or 'no header'}"
                )
            rows = list(reader)
    except OSError as exc:
        raise WorkloadError(f"cannot read CSV trace {p}: {exc.strerror}") from None
    jobs: list[SimJob] = []
    dropped = {"non_positive_duration": 0}
    clock = 0.0
    for line, row in enumerate(rows, start=2):
        where = f"{p.name}:{line}"
        if "gap" in m:
            clock += _num(row[m["gap"]], "gap", where) * unit
            arrival = clock
        else:
            arrival = _num(row[m["arrival"]], "arrival", where) * unit
        if "end" in m:
            run = _num(row[m["end"]], "end", where) * unit - arrival
        else:
            run = _num(row[m["duration"]], "duration", where) * unit
        if run <= 0:
            dropped["non_positive_duration"] += 1
            continue
        demand, shape = _demand(m, row, model, where)
        ls = False
        if "latency_sensitive" in m:
            v = row[m["latency_sensitive"]].strip().lower()
            if v not in TRUE | FALSE:
                raise WorkloadError(f"{where}: latency_sensitive {v!r} is not true/false")
            ls = v in TRUE
        patience = _num(row[m["patience"]], "patience", where) * unit if "patience" in m else None
        jobs.append(
            SimJob(
                id=row[m["id"]] if "id" in m else f"job-{line - 1}",
                arrival=arrival,
                duration=run,
                demand=demand,
                shape=shape,
                tenant=row[m["tenant"]] if "tenant" in m else "default",
                priority=_priority(row[m["priority"]], where) if "priority" in m else 0,
                latency_sensitive=ls,
                wclass=row[m["class"]] if "class" in m else default_class,
                patience=patience,
            )
        )
    if not jobs:
        raise WorkloadError(f"{p.name}: no job with a positive run time")
    return Workload(
        name=name or f"csv:{p.stem}", jobs=sort_jobs(jobs), dropped={k: v for k, v in dropped.items() if v}
    )
