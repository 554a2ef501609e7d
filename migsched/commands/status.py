"""``migsched status``: the cluster from the state store: each GPU's slices, load and FragCost; jobs by
state."""

from __future__ import annotations

import asyncio
import sys

import click
from rich.console import Console

from migsched import clusterview, endpoints
from shared.mig.geometry import default_geometry
from shared.state import JOB_STATES


@click.command("status")
@endpoints.options
@click.option("--json", "as_json", is_flag=True, help="Every GPU's instances and every job's state, as JSON.")
@click.option("--jobs", "show_jobs", type=int, default=20, show_default=True, help="Jobs to list.")
@click.option("--tenant", "tenants", multiple=True, help="Only this tenant's jobs (repeatable).")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(JOB_STATES),
    help="Only jobs in this state (repeatable) [default: the active ones].",
)
def command(
    nats_url: str,
    redis_url: str,
    namespace: str,
    as_json: bool,
    show_jobs: int,
    tenants: tuple[str, ...],
    states: tuple[str, ...],
) -> None:
    """Show the cluster: one row of memory slices per GPU (who holds each), load, FragCost; jobs by state."""

    async def run() -> clusterview.ClusterView:
        state = await endpoints.open_state(endpoints.settings(nats_url, redis_url, namespace))
        try:
            return await clusterview.read(state, default_geometry())
        finally:
            await state.close()

    view = asyncio.run(run())
    if as_json:
        sys.stdout.buffer.write(clusterview.as_json(view) + b"\n")
        return
    console = Console()
    console.print(clusterview.render(view, show_jobs=show_jobs, width=console.width, tenants=tenants, states=states))
