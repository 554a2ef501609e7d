"""The executor's Prometheus metrics (one set per process, labelled by node so in-process tests can share
it)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from services.common.metric_cache import child
from shared.events import CmdFailed, Command

_COMMANDS = Counter(
    "migsched_executor_commands_total", "Commands applied, by kind and outcome", ["node", "kind", "outcome"]
)
_APPLY = Histogram(
    "migsched_executor_apply_seconds",
    "Time to apply one command (MIG ops + workload start)",
    ["node", "kind"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
_LATENCY = Histogram(
    "migsched_executor_submit_to_command_seconds",
    "Job submit -> command received by the executor",
    ["node"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
_RECONFIG = Counter(
    "migsched_executor_reconfigurations_total", "GPU instances created or destroyed", ["node"]
)
_MIGRATIONS = Counter("migsched_executor_migrations_total", "Workloads moved make-before-break", ["node"])
_EXITS = Counter("migsched_executor_job_exits_total", "Job exits reported, by kind", ["node", "kind"])
_RUNNING = Gauge("migsched_executor_running_jobs", "Workloads running on this node", ["node"])


class ExecutorMetrics:
    """The node's children are kept (``services.common.metrics.child``): ``labels()`` is ≈ 3 µs a call and
    every command and exit records several."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._latency = _LATENCY.labels(node)
        self._reconfig = _RECONFIG.labels(node)
        self._migrations = _MIGRATIONS.labels(node)
        self._running = _RUNNING.labels(node)

    def received(self, cmd: Command) -> None:
        if cmd.kind == "place" and cmd.submitted_at > 0:
            self._latency.observe(max(0.0, time.time() - cmd.submitted_at))

    def applied(self, cmd: Command, reports: Sequence[Any], seconds: float) -> None:
        failed = any(isinstance(r, CmdFailed) for r in reports)
        child(_COMMANDS, self.node, cmd.kind, "failed" if failed else "done").inc()
        child(_APPLY, self.node, cmd.kind).observe(seconds)

    def reconfigured(self, n: int) -> None:
        self._reconfig.inc(n)

    def migrated(self) -> None:
        self._migrations.inc()

    def exited(self, kind: str) -> None:
        child(_EXITS, self.node, kind).inc()

    def running(self, n: int) -> None:
        self._running.set(n)
