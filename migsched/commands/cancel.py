"""``migsched cancel``: publish ``JobCancel`` for one or more jobs.

Each id is looked up first. An unknown id is reported and left alone, so that it stays free for a later
submit (a cancel of an unknown id leaves a tombstone that drops that submit; ``--force`` sends it anyway, for
a job just published that the balancer has not stored yet). A job that already ended is reported and left.
Exit status: 0 every job was known (and the live ones were sent a cancel), 1 some id was unknown.
"""

from __future__ import annotations

import asyncio
import sys

import click

from migsched import endpoints
from shared.client import MigschedClient
from shared.state.model import TERMINAL_STATES


@click.command("cancel")
@endpoints.options
@click.option("--reason", default="cancelled by the user", show_default=True)
@click.option("--force", is_flag=True, help="Send the cancel even for an id the state store does not know.")
@click.argument("job_ids", nargs=-1, required=True)
def command(
    nats_url: str, redis_url: str, namespace: str, reason: str, force: bool, job_ids: tuple[str, ...]
) -> None:
    """Cancel jobs (pending ones leave the queue, running ones are stopped; finished ones are left alone)."""

    async def run() -> int:
        code = 0
        async with MigschedClient(nats_url, namespace=namespace, redis_url=redis_url) as c:
            for j in job_ids:
                state = await c.state(j)
                if state is None and not force:
                    where = f"namespace {namespace!r}" if namespace else "the default namespace"
                    click.echo(f"unknown job: {j} (not in {where}; --force sends the cancel anyway)", err=True)
                    code = 1
                elif state in TERMINAL_STATES:
                    click.echo(f"already {state}: {j}")
                else:
                    await c.cancel(j, reason)
                    click.echo(f"cancel requested: {j}")
        return code

    sys.exit(asyncio.run(run()))
