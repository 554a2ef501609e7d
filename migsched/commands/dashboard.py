"""``migsched dashboard``: the cluster as a live, read-only web page."""

from __future__ import annotations

import asyncio
import contextlib

import click

from migsched import dashboard, endpoints
from shared.mig.geometry import default_geometry


@click.command("dashboard")
@endpoints.options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; the page is read-only, but it shows every job: keep it on loopback or "
                   "behind your own authentication.")
@click.option("--port", type=click.IntRange(1, 65535), default=8089, show_default=True)
@click.option("--threshold", type=float, default=0.4, show_default=True,
              help="Lazy/Busy load threshold to mark each GPU with (the balancer's MIGSCHED_THRESHOLD).")
def command(nats_url: str, redis_url: str, namespace: str, host: str, port: int, threshold: float) -> None:
    """Serve http://HOST:PORT/: every GPU's slices by job and tenant, the queue with its reasons and
    reservations, utilisation and fragmentation over the last hour, and recent decisions; updated each second."""

    async def serve() -> None:
        state = await endpoints.open_state(endpoints.settings(nats_url, redis_url, namespace))
        click.echo(f"dashboard on http://{host}:{port}/ (namespace {namespace or 'default'}); Ctrl-C stops it")
        await dashboard.run(state, default_geometry(), host, port, threshold)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
