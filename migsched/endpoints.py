"""The connection options every live-stack verb shares: NATS, Redis and the namespace, from flags or
MIGSCHED_*."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from shared.settings import Settings, load


def options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds ``--nats-url``, ``--redis-url`` and ``--namespace`` (defaults from the MIGSCHED_* variables)."""
    fn = click.option(
        "--namespace",
        envvar="MIGSCHED_NAMESPACE",
        default="",
        show_default=True,
        help="Deployment namespace (prefixes streams, subjects and Redis keys).",
    )(fn)
    fn = click.option(
        "--redis-url",
        envvar="MIGSCHED_REDIS_URL",
        default="redis://127.0.0.1:6379/0",
        show_default=True,
        help="Redis (cluster state).",
    )(fn)
    fn = click.option(
        "--nats-url",
        envvar="MIGSCHED_NATS_URL",
        default="nats://127.0.0.1:4222",
        show_default=True,
        help="NATS server(s), comma-separated.",
    )(fn)
    return fn


def settings(nats_url: str, redis_url: str, namespace: str) -> Settings:
    return load(Settings, nats_url=nats_url, redis_url=redis_url, namespace=namespace)
