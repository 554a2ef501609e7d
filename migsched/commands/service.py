"""``migsched service balancer|registry|migration-planner|executor``: run one service in the foreground.

Configuration comes from ``MIGSCHED_*`` environment variables (README "Configuration"); the options here are
shortcuts for the most common ones.
"""

from __future__ import annotations

from typing import Any

import click

SERVICES = {
    "balancer": ("services.balancer.service", "Balancer", "BalancerSettings"),
    "registry": ("services.registry.service", "NodeRegistry", "RegistrySettings"),
    "migration-planner": (
        "services.migration_planner.service",
        "MigrationPlanner",
        "MigrationPlannerSettings",
    ),
}


@click.command(name="service")
@click.argument("name", type=click.Choice(sorted([*SERVICES, "executor"])))
@click.option("--nats", "nats_url", default=None, help="NATS URL (MIGSCHED_NATS_URL).")
@click.option("--redis", "redis_url", default=None, help="Redis URL (MIGSCHED_REDIS_URL).")
@click.option("--namespace", default=None, help="Stream/subject/key namespace (MIGSCHED_NAMESPACE).")
@click.option(
    "--metrics-port", type=int, default=None, help="Prometheus port, 0 = off (MIGSCHED_METRICS_PORT)."
)
def command(
    name: str, nats_url: str | None, redis_url: str | None, namespace: str | None, metrics_port: int | None
) -> None:
    """Run the NAME scheduling service until SIGINT/SIGTERM."""
    import importlib

    from services.common.runner import run
    from shared import settings as settings_mod

    module, cls, settings_cls = SERVICES.get(name, ("", "", ""))
    overrides: dict[str, Any] = {
        k: v
        for k, v in (
            ("nats_url", nats_url),
            ("redis_url", redis_url),
            ("namespace", namespace),
            ("metrics_port", metrics_port),
        )
        if v is not None
    }
    if name == "executor":  # one per GPU node, with its own runner (services/executor/service.py)
        from services.executor.service import main as run_executor

        run_executor(**overrides)
        return
    run(getattr(importlib.import_module(module), cls), getattr(settings_mod, settings_cls), **overrides)
