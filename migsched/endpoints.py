"""The connection options every live-stack verb shares: NATS, Redis and the namespace, from flags or
MIGSCHED_*."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import click

from shared.settings import Settings, load

if TYPE_CHECKING:
    from shared.state import RedisState


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    # Context.meta is shared by every context of the invocation: the command group's error handler reads the
    # URLs a failing verb used from there (``explain``)
    ctx.meta[param.name or ""] = value
    return value


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
        callback=_remember,
    )(fn)
    fn = click.option(
        "--nats-url",
        envvar="MIGSCHED_NATS_URL",
        default="nats://127.0.0.1:4222",
        show_default=True,
        help="NATS server(s), comma-separated.",
        callback=_remember,
    )(fn)
    return fn


def settings(nats_url: str, redis_url: str, namespace: str) -> Settings:
    return load(Settings, nats_url=nats_url, redis_url=redis_url, namespace=namespace)


def configured_shards(flag: int | None = None) -> int | None:
    """The shard count asked for: ``--shards``, else ``MIGSCHED_SHARDS`` when set, else None (the count the
    namespace's services recorded is then used)."""
    if flag is not None:
        return flag
    raw = os.environ.get("MIGSCHED_SHARDS", "").strip()
    return int(raw) if raw.isdigit() else None


async def open_state(settings: Settings, shards: int | None = None, cls: type[RedisState] | None = None) -> RedisState:
    """The namespace's store with the deployment's shard count (``shared.state.deployment.open_reader``): a verb
    run without ``MIGSCHED_SHARDS`` sees every shard, and one run with another count than the services' is
    refused (``ShardCountMismatch``) instead of showing part of the cluster. ``cls``: a subclass (the audit's
    read-only store)."""
    from shared.state import RedisState
    from shared.state.deployment import open_reader

    return await open_reader(cls or RedisState, settings, configured_shards(shards))


def safe_url(url: str) -> str:
    """The URL without its password (it goes into error messages)."""
    u = urlsplit(url)
    return url.replace(f":{u.password}@", ":***@") if u.password else url


def explain(exc: BaseException, params: Mapping[str, Any]) -> str | None:
    """One line for an operator when a live verb fails on an endpoint or a setting (``params``: the verb's
    options, for the URLs), or None for a fault that is a bug (its traceback then stays)."""
    from shared.errors import MigschedError

    module = type(exc).__module__
    if isinstance(exc, MigschedError):
        return str(exc)
    if module.startswith("redis"):
        import redis.exceptions as rex

        where = safe_url(str(params.get("redis_url") or "Redis"))
        if isinstance(exc, rex.NoPermissionError | rex.AuthenticationError):
            return f"Redis at {where} refused this user: {exc}"
        if isinstance(exc, rex.ConnectionError | rex.TimeoutError):
            return f"cannot reach Redis at {where}: {exc}"
        return None
    where = safe_url(str(params.get("nats_url") or "NATS"))
    if module.startswith("nats"):
        import nats.errors as nerr

        if isinstance(exc, nerr.NoServersError | nerr.ConnectionClosedError | nerr.TimeoutError):
            return f"cannot reach NATS at {where}: {exc or type(exc).__name__}"
        return f"NATS at {where} refused: {type(exc).__name__}: {exc}"
    if isinstance(exc, ConnectionError | TimeoutError):
        # nats-py lets the socket's own error through when no server of the list answers at start (a Redis
        # connection's arrives wrapped in redis.exceptions, above)
        return f"cannot reach NATS at {where}: {exc or type(exc).__name__}"
    return None
