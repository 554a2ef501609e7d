"""The executor's Prometheus metrics (one set per process, labelled by node so in-process tests can share
it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

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
    def __init__(self, node: str) -> None:
        self.node = node

    def received(self, cmd: Command) -> None:
        if cmd.kind == "place" and cmd.submitted_at > 0:
            import time

            _LATENCY.labels(self.node).observe(max(0.0, time.time() - cmd.submitted_at))

    def applied(self, cmd: Command, reports: Sequence[Any], seconds: float) -> None:
        failed = any(isinstance(r, CmdFailed) for r in reports)
        _COMMANDS.labels(self.node, cmd.kind, "failed" if failed else "done").inc()
        _APPLY.labels(self.node, cmd.kind).observe(seconds)

    def reconfigured(self, n: int) -> None:
        _RECONFIG.labels(self.node).inc(n)

    def migrated(self) -> None:
        _MIGRATIONS.labels(self.node).inc()

    def exited(self, kind: str) -> None:
        _EXITS.labels(self.node, kind).inc()

    def running(self, n: int) -> None:
        _RUNNING.labels(self.node).set(n)
