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
    nodes: str = ""
    """sim backend only: several simulated nodes in this one process (comma-separated names), each with its own
    consumer, subjects, heartbeats and GPUs (``executor_gpus`` each), as separate processes would have, over one
    shared NATS connection; a bench of many nodes on a few cores then spends no CPU on an event loop and a socket
    per node. Overrides ``node``."""
    node_labels: str = ""
    """This node's topology labels, ``key=value,...`` (e.g. ``block=b1,rack=r07``): a gang may ask to stay
    within one ``block`` or ``rack``, and with several shards a node's ``block`` is its shard."""
    node_addr: str = ""
    """The address other nodes reach this node's workloads at (a host name or IP): a gang whose first member is
    here gets it as ``MASTER_ADDR``. Empty uses the host name."""
    executor_backend: str = "sim"
    """``sim`` (simulated GPUs) or ``nvml`` (real MIG through NVML)."""
    executor_gpus: str = "A100-40GB:8"
    """GPUs as MODEL[:COUNT[:MODE]],... in index order; MODE is mig (default), whole (not in MIG mode: whole-GPU
    jobs) or shared=N (not in MIG mode, time-sliced into N shares). sim: the simulated GPUs; nvml: a cross-check
    of the models, and the replicas of GPUs that NVML reports not in MIG mode (NVML decides the mode)."""
    executor_sim_workloads: str = "sleep"
    """sim backend: ``sleep`` (a workload "runs" for its duration hint) or ``process`` (its argv runs as a real
    process, with the environment and the simulated GPUs' UUIDs an NVML node would give it: a launch script,
    a gang's rendezvous included, can be tried on CPUs)."""
    executor_reconfig_latency_s: float = 0.15
    """Simulated duration of one GPU-instance create or destroy (divided by the speed-up)."""
    executor_speedup: float = 1.0
    """Simulated time runs this many times faster than wall time (job durations and reconfigurations)."""
    heartbeat_s: float = 2.0
    """Heartbeat period; the node registry marks a node lost after MIGSCHED_NODE_TIMEOUT_S without one."""
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


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """One configured GPU: its model and sharing mode (set per GPU, not per node)."""

    model: str
    mig: bool = True
    replicas: int = 0
    """Not in MIG mode: time-sliced into this many shares (0: whole-GPU jobs only)."""


def _mode(spec: str, part: str, mode: str) -> tuple[bool, int]:
    mode = mode.strip().lower()
    if mode in ("", "mig"):
        return True, 0
    if mode == "whole":
        return False, 0
    name, eq, value = mode.partition("=")
    if name == "shared" and eq:
        try:
            replicas = int(value)
        except ValueError:
            replicas = 0
        if 1 <= replicas <= 64:
            return False, replicas
        raise ExecutorError(f"MIGSCHED_EXECUTOR_GPUS={spec!r}: {part!r}: shared=N needs N in 1..64")
    raise ExecutorError(
        f"MIGSCHED_EXECUTOR_GPUS={spec!r}: {part!r}: mode {mode!r} is not mig, whole or shared=N"
    )


def parse_gpu_specs(spec: str) -> list[GpuSpec]:
    """``A100-40GB:4,A100-40GB:2:whole,H100-80GB:1:shared=4`` -> one ``GpuSpec`` per GPU, in index order."""
    geometry = default_geometry()
    out: list[GpuSpec] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, rest = part.partition(":")
        count, _, mode = rest.partition(":")
        try:
            n = int(count or "1")
            model = geometry.model(name.strip()).name
        except (ValueError, KeyError) as exc:
            raise ExecutorError(f"MIGSCHED_EXECUTOR_GPUS={spec!r}: bad entry {part!r} ({exc})") from None
        if not 1 <= n <= 64:
            raise ExecutorError(f"MIGSCHED_EXECUTOR_GPUS={spec!r}: count {n} must be 1..64")
        mig, replicas = _mode(spec, part, mode)
        out += [GpuSpec(model=model, mig=mig, replicas=replicas)] * n
    if not out:
        raise ExecutorError("MIGSCHED_EXECUTOR_GPUS names no GPU")
    if len(out) > 64:
        raise ExecutorError(f"MIGSCHED_EXECUTOR_GPUS={spec!r}: {len(out)} GPUs, at most 64 per node")
    return out


def parse_gpus(spec: str) -> list[str]:
    """``A100-40GB:8,H100-80GB:2`` -> one model name per GPU, in index order."""
    return [g.model for g in parse_gpu_specs(spec)]


def node_name(configured: str) -> str:
    name = configured or re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0])
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}", name):
        raise ExecutorError(f"node name {name!r} must be one subject token ([A-Za-z0-9_-], at most 63)")
    return name


def hosted_nodes(settings: ExecutorSettings) -> list[str]:
    """The nodes this process runs: ``nodes`` (sim only, distinct names) or the one ``node``."""
    if not settings.nodes:
        return [node_name(settings.node)]
    names = [node_name(n.strip()) for n in settings.nodes.split(",") if n.strip()]
    if settings.executor_backend != "sim":
        raise ExecutorError(f"MIGSCHED_NODES hosts simulated nodes only; the {settings.executor_backend} "
                            "backend drives the GPUs of its own host: run one executor per node")
    if not names or len(set(names)) != len(names):
        raise ExecutorError(f"MIGSCHED_NODES={settings.nodes!r} must name distinct nodes")
    return names


def build_backend(settings: ExecutorSettings, node: str) -> Backend:
    kind = settings.executor_backend
    if kind == "sim":
        specs = parse_gpu_specs(settings.executor_gpus)
        return make_backend(
            "sim",
            node=node,
            models=[g.model for g in specs],
            reconfig_latency_s=settings.executor_reconfig_latency_s,
            speedup=settings.executor_speedup,
            mig_disabled=[i for i, g in enumerate(specs) if not g.mig],
            workloads=_sim_workloads(settings.executor_sim_workloads),
            env_allowlist=env_allowlist(settings),
        )
    if kind == "nvml":
        return make_backend(
            "nvml",
            node=node,
            models=parse_gpus(settings.executor_gpus),
            state_dir=settings.executor_state_dir,
            confirm_s=settings.executor_confirm_s,
            env_allowlist=env_allowlist(settings),
            destroy_foreign=settings.executor_destroy_foreign,
            in_use_retry_s=settings.executor_in_use_retry_s,
            stop_grace_s=settings.executor_stop_grace_s,
            keep_logs=settings.executor_keep_logs,
        )
    raise ExecutorError(f"MIGSCHED_EXECUTOR_BACKEND={kind!r}: expected sim or nvml")


def env_allowlist(settings: ExecutorSettings) -> tuple[str, ...]:
    """The shell patterns of the variables a workload may receive."""
    return tuple(p.strip() for p in settings.executor_env_allowlist.split(",") if p.strip())


def _sim_workloads(value: str) -> str:
    if value not in ("sleep", "process"):
        raise ExecutorError(f"MIGSCHED_EXECUTOR_SIM_WORKLOADS={value!r}: expected sleep or process")
    return value


_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,62}")


def parse_labels(spec: str) -> dict[str, str]:
    """``block=b1,rack=r07`` -> ``{"block": "b1", "rack": "r07"}``; ExecutorError for a malformed entry."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not _LABEL.fullmatch(key) or len(value) > 256:
            raise ExecutorError(f"MIGSCHED_NODE_LABELS={spec!r}: {part!r} is not key=value (a key of letters, "
                                "digits, . _ / -; a value of at most 256 characters)")
        out[key] = value
    if len(out) > 32:
        raise ExecutorError(f"MIGSCHED_NODE_LABELS={spec!r}: at most 32 labels")
    return out
