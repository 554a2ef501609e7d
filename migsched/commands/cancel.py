"""``migsched cancel``: publish ``JobCancel`` for one or more jobs."""

from __future__ import annotations

import asyncio

import click

from migsched import endpoints
from shared.client import MigschedClient


@click.command("cancel")
@endpoints.options
@click.option("--reason", default="cancelled by the user", show_default=True)
@click.argument("job_ids", nargs=-1, required=True)
def command(nats_url: str, redis_url: str, namespace: str, reason: str, job_ids: tuple[str, ...]) -> None:
    """Cancel jobs (pending ones leave the queue, running ones are stopped; finished ones are left alone)."""

    async def run() -> None:
        async with MigschedClient(nats_url, namespace=namespace) as c:
            for j in job_ids:
                await c.cancel(j, reason)
                click.echo(f"cancel requested: {j}")

    asyncio.run(run())
