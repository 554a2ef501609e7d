"""The public traces the simulator replays: where each one is read from here, and where to get it.

Traces are third-party data and are never copied into the repository. They are read in place from
``MIGSCHED_TRACES_DIR`` (default ``<repo>/../shared/traces``), one folder per trace, laid out as the
upstream repository lays out its files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

UPSTREAM = "https://github.com/alibaba/clusterdata"
SNAPSHOT = "7a6c496e4f4b6ce6150be8f881cb051bf2abff42"
ITP_UPSTREAM = "https://github.com/microsoft/elasticflow-traces"
ITP_SNAPSHOT = "277ed24d0e908c31a1c98145819e2e3853d8ac00"


@dataclass(frozen=True, slots=True)
class Trace:
    name: str  # the workload name the simulator takes (``openb:<variant>``, ``dlrm``, ``itp:<cluster>``)
    folder: str  # under the traces directory
    pattern: str  # the files of this trace inside ``folder``
    upstream_path: str  # inside ``upstream`` at ``snapshot``
    what: str
    upstream: str = UPSTREAM
    snapshot: str = SNAPSHOT
    unpack: bool = False  # ``upstream_path`` is an archive whose files go into ``folder``

    def files(self, root: Path | None = None) -> list[Path]:
        return sorted((root or traces_dir()).joinpath(self.folder).glob(self.pattern))

    def fetch_hint(self) -> str:
        return (
            f"clone {self.upstream}, check out {self.snapshot}, and {'unpack' if self.unpack else 'copy'} "
            f"{self.upstream_path} into $MIGSCHED_TRACES_DIR/{self.folder}/"
        )


TRACES: tuple[Trace, ...] = (
    Trace(
        name="openb",
        folder="alibaba-gpu-v2023-openb",
        pattern="openb_pod_list_*.csv",
        upstream_path="cluster-trace-gpu-v2023/csv/*.csv",
        what="Alibaba GPU-sharing pod trace (FGD, USENIX ATC'23): default, gpushare20..100, gpuspec*, cpu*",
    ),
    Trace(
        name="dlrm",
        folder="alibaba-gpu-v2025-dlrm",
        pattern="disaggregated_DLRM_trace.csv",
        upstream_path="cluster-trace-gpu-v2025/disaggregated_DLRM_trace.csv",
        what="Alibaba DLRM inference instances (NSDI'25), one whole GPU each: the background load",
    ),
    Trace(
        name="itp",
        folder="microsoft-itp-2021",
        pattern="cluster*.csv",
        upstream_path="data/raw-traces.tar.gz",
        what="Microsoft ITP training jobs (ElasticFlow, ASPLOS'23): 10 clusters, 69,351 jobs of 1-64 whole GPUs, "
             "gangs across nodes among them",
        upstream=ITP_UPSTREAM,
        snapshot=ITP_SNAPSHOT,
        unpack=True,
    ),
)


def traces_dir() -> Path:
    """``MIGSCHED_TRACES_DIR`` or ``<repo>/../shared/traces``."""
    env = os.environ.get("MIGSCHED_TRACES_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[3]
    return repo.parent / "shared" / "traces"


def trace(name: str) -> Trace:
    for t in TRACES:
        if t.name == name:
            return t
    raise KeyError(name)


def missing_hint(name: str) -> str:
    """What a loader says when a trace file is absent: where it looked and how to get it."""
    t = trace(name)
    return (
        f"traces are read from {traces_dir() / t.folder} (set MIGSCHED_TRACES_DIR); "
        f"to get them, {t.fetch_hint()}; `migsched traces` lists what is found"
    )
