"""The executor's configuration: its ``MIGSCHED_*`` settings, the GPU list of a simulated node, the node name,
and the backend built from them."""

from __future__ import annotations

import dataclasses
import re
import socket

from services.executor.backend import Backend
from services.executor.backends import make_backend
from shared.errors import MigschedError
from shared.mig.geometry import default_geometry
from shared.settings import Settings


class ExecutorError(MigschedError):
    """The executor cannot start (bad GPU list, unusable node name)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExecutorSettings(Settings):
    metrics_port: int = 9104
    """Prometheus endpoint of the executor (``migsched up`` gives each executor its own port)."""
    node: str = ""
    """This node's name (one subject token); empty uses the host name."""
    executor_backend: str = "sim"
    """``sim`` (simulated GPUs) or ``nvml`` (real MIG through NVML)."""
    executor_gpus: str = "A100-40GB:8"
    """Simulated GPUs as MODEL:COUNT[,MODEL:COUNT...]; with nvml a cross-check of what the node has."""
    executor_reconfig_latency_s: float = 0.15
    """Simulated duration of one GPU-instance create or destroy (divided by the speed-up)."""
    executor_speedup: float = 1.0
    """Simulated time runs this many times faster than wall time (job durations and reconfigurations)."""
    heartbeat_s: float = 2.0
    """Heartbeat period; the partitioner marks a node lost after MIGSCHED_NODE_TIMEOUT_S without one."""
    executor_state_dir: str = "/var/lib/migsched/executor"
    """nvml backend: where owned instances and jobs are recorded (so a restarted executor adopts them)."""
    executor_confirm_s: float = 1.0
    """Migration: how long the target copy must stay up before the source copy is stopped."""
    executor_latency_log: str = ""
    """Benchmarks: append ``job_id submitted_at received_at`` for every place command to this file."""
    executor_env_allowlist: str = "PATH,HOME,LANG,LC_*,TZ,TMPDIR,USER,LOGNAME"
    """nvml: variables a workload may receive (shell patterns); CUDA_VISIBLE_DEVICES is always set."""
    executor_destroy_foreign: bool = False
    """nvml: allow destroying instances this executor did not create."""
    executor_in_use_retry_s: float = 2.0
    """nvml: how long a destroy retries NVML's "in use" answer after a process exits."""
    executor_stop_grace_s: float = 10.0
    """nvml: SIGTERM to SIGKILL delay when a workload is stopped."""
    executor_keep_logs: bool = False
    """nvml: keep each workload's log file after it exits."""


def parse_gpus(spec: str) -> list[str]:
    """``A100-40GB:8,H100-80GB:2`` -> one model name per GPU, in index order."""
    geometry = default_geometry()
    models: list[str] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, count = part.partition(":")
        try:
            n = int(count or "1")
            model = geometry.model(name.strip()).name
        except (ValueError, KeyError) as exc:
            raise ExecutorError(f"MIGSCHED_EXECUTOR_GPUS={spec!r}: bad entry {part!r} ({exc})") from None
        if not 1 <= n <= 64:
            raise ExecutorError(f"MIGSCHED_EXECUTOR_GPUS={spec!r}: count {n} must be 1..64")
        models += [model] * n
    if not models:
        raise ExecutorError("MIGSCHED_EXECUTOR_GPUS names no GPU")
    return models


def node_name(configured: str) -> str:
    name = configured or re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0])
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}", name):
        raise ExecutorError(f"node name {name!r} must be one subject token ([A-Za-z0-9_-], at most 63)")
    return name


def build_backend(settings: ExecutorSettings, node: str) -> Backend:
    kind = settings.executor_backend
    if kind == "sim":
        return make_backend(
            "sim",
            node=node,
            models=parse_gpus(settings.executor_gpus),
            reconfig_latency_s=settings.executor_reconfig_latency_s,
            speedup=settings.executor_speedup,
        )
    if kind == "nvml":
        return make_backend(
            "nvml",
            node=node,
            models=parse_gpus(settings.executor_gpus),
            state_dir=settings.executor_state_dir,
            confirm_s=settings.executor_confirm_s,
            env_allowlist=tuple(p.strip() for p in settings.executor_env_allowlist.split(",") if p.strip()),
            destroy_foreign=settings.executor_destroy_foreign,
            in_use_retry_s=settings.executor_in_use_retry_s,
            stop_grace_s=settings.executor_stop_grace_s,
            keep_logs=settings.executor_keep_logs,
        )
    raise ExecutorError(f"MIGSCHED_EXECUTOR_BACKEND={kind!r}: expected sim or nvml")
