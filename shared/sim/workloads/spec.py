"""A workload from its name: ``openb[:VARIANT|PATH]``, ``dlrm[:PATH]``, ``itp:CLUSTER`` (Microsoft's ITP
traces), ``csv:PATH`` (with a column mapping) or ``synthetic[:MIX]``, with an optional DLRM background beside it.
The CLI and the benchmark matrix both build their workloads here."""

from __future__ import annotations

import random

import msgspec
import numpy as np

from shared.mig.geometry import Geometry
from shared.sim.cluster_spec import ClusterSpec
from shared.sim.errors import WorkloadError
from shared.sim.jobs import Workload


class WorkloadSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    """``openb[:VARIANT|PATH]`` | ``dlrm[:PATH]`` | ``itp:CLUSTER`` | ``csv:PATH`` | ``synthetic[:MIX]``"""
    seed: int = 0
    jobs: int = 10_000
    """synthetic: how many jobs"""
    load: float = 0.9
    """synthetic: offered load (share of the cluster's compute)"""
    window: str = "auto"
    time_scale: float = 1.0
    limit: int | None = None
    """replay only the first N jobs"""
    csv_map: str = ""
    dlrm_gpus: float = 0.0
    """GPUs of DLRM background beside the workload (0: none); for ``dlrm`` alone, its size (0: half the
    cluster)"""
    jitter_s: float = 0.0
    """Shift each arrival by up to this many seconds either way, drawn from ``seed`` (0: as recorded). A
    saturated cluster is chaotic: the same trace with a few arrivals reordered can reject a few points more or
    fewer, so a trace is judged over several jittered replays rather than one."""


def build(spec: WorkloadSpec, cluster: ClusterSpec, geometry: Geometry) -> Workload:
    from shared.sim.workloads.csv import load_csv
    from shared.sim.workloads.dlrm import load_dlrm
    from shared.sim.workloads.itp import load_itp
    from shared.sim.workloads.openb import load_openb
    from shared.sim.workloads.synthetic import MIXES, synthetic

    model = geometry.model(cluster.nodes[0].model)
    kind, _, arg = spec.name.partition(":")
    if kind == "openb":
        wl = load_openb(arg or "default", model, window=spec.window, time_scale=spec.time_scale, limit=spec.limit)
    elif kind == "itp":
        if not arg:
            raise WorkloadError("-w itp:CLUSTER needs the cluster, cluster01 to cluster10")
        wl = load_itp(arg, model)
    elif kind == "csv":
        if not arg or not spec.csv_map:
            raise WorkloadError("-w csv:PATH needs the file and --csv-map key=column,...")
        wl = load_csv(arg, spec.csv_map, model)
    elif kind == "synthetic":
        mix = arg or "default"
        if mix not in MIXES:
            raise WorkloadError(f"unknown synthetic mix {arg!r}: one of {', '.join(MIXES)}")
        slices = sum(n.gpus * geometry.model(n.model).compute_slices for n in cluster.nodes)
        wl = synthetic(np.random.default_rng(spec.seed), jobs=spec.jobs, load=spec.load, cluster_slices=slices,
                       classes=MIXES[mix], mix=mix)
    elif kind == "dlrm":
        gpus = spec.dlrm_gpus or cluster.gpu_count / 2
        wl = load_dlrm(random.Random(spec.seed), gpus=gpus, path=arg or None)
    else:
        raise WorkloadError(f"unknown workload {spec.name!r}: use openb[:VARIANT|PATH], dlrm, itp:CLUSTER, "
                            "csv:PATH or synthetic")
    wl = wl.jittered(spec.jitter_s, spec.seed)
    if kind != "dlrm" and spec.dlrm_gpus > 0:
        t0 = wl.jobs[0].arrival
        span = wl.jobs[-1].arrival - t0
        wl = wl.merged(load_dlrm(random.Random(spec.seed), gpus=spec.dlrm_gpus, offset=t0, horizon=span))
    if spec.limit and kind != "openb":
        wl = msgspec.structs.replace(wl, jobs=wl.jobs[: spec.limit])
    return wl


def within_blocks(workload: Workload, required: bool) -> Workload:
    """Every gang (``gpus: n``, n > 1) of ``workload`` kept within one topology block: required, or preferred."""
    jobs = tuple(msgspec.structs.replace(j, within_block=required) if j.demand.kind == "gpus" and j.gpus > 1 else j
                 for j in workload.jobs)
    return msgspec.structs.replace(workload, jobs=jobs)
