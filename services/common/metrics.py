"""Prometheus metrics that more than one scheduling service records. Each service's own are in its package
(``services/balancer/metrics.py``, ``services/registry/metrics.py``); a process registers only the metrics of
the services it runs, so an executor exports no scheduling metric. Which process a series comes from is
Prometheus's ``job`` and ``instance`` labels, not one of ours. The reference is docs/operations.md, "Metrics".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import Counter

from services.common.metric_cache import child

__all__ = ["MIGRATIONS", "RECONFIGURATIONS", "child", "count_reconfigurations"]

RECONFIGURATIONS = Counter(
    "migsched_reconfigurations_total", "MIG GPU instances created or destroyed by commands", ["op"]
)
MIGRATIONS = Counter("migsched_migrations_total", "Migration moves by kind and outcome", ["kind", "outcome"])


def count_reconfigurations(ops: Iterable[Any]) -> None:
    """One ``RECONFIGURATIONS`` increment per GPU instance a command's ops create or destroy."""
    for op in ops:
        if op.kind in ("create_gi", "destroy_gi"):
            child(RECONFIGURATIONS, op.kind).inc()
