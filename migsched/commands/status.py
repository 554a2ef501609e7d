"""``migsched status``: the cluster from the state store: each GPU's slices, load and FragCost (or, for a large
cluster, one row per node); jobs by state."""

from __future__ import annotations

import asyncio
import sys

import click
import msgspec
from rich.console import Console

from migsched import clusterview, endpoints, nodeview
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
@click.option("--by-node/--by-gpu", default=None,
              help=f"One row per node, or per GPU [default: per node above {nodeview.PER_GPU_MAX} GPUs].")
@click.option("--node", "nodes", multiple=True, help="Only this node's GPUs (repeatable).")
def command(
    nats_url: str,
    redis_url: str,
    namespace: str,
    as_json: bool,
    show_jobs: int,
    tenants: tuple[str, ...],
    states: tuple[str, ...],
    by_node: bool | None,
    nodes: tuple[str, ...],
) -> None:
    """Show the cluster: one row of memory slices per GPU (who holds each), load, FragCost; jobs by state."""

    async def run() -> clusterview.ClusterView:
        state = await endpoints.open_state(endpoints.settings(nats_url, redis_url, namespace))
        try:
            return await clusterview.read(state, default_geometry())
        finally:
            await state.close()

    view = asyncio.run(run())
    if nodes:
        unknown = sorted(set(nodes) - set(view.nodes))
        if unknown:
            raise click.BadParameter(f"no node {', '.join(unknown)} in this cluster", param_hint="--node")
        view = msgspec.structs.replace(view, gpus=tuple(g for g in view.gpus if g.node in nodes),
                                       nodes={n: s for n, s in view.nodes.items() if n in nodes},
                                       blocks={n: b for n, b in view.blocks.items() if n in nodes})
    if as_json:
        sys.stdout.buffer.write(clusterview.as_json(view) + b"\n")
        return
    console = Console()
    per_node = by_node if by_node is not None else len(view.gpus) > nodeview.PER_GPU_MAX
    machines = nodeview.node_table(view, "migsched cluster") if per_node else None
    console.print(clusterview.render(view, show_jobs=show_jobs, width=console.width, tenants=tenants, states=states,
                                     machines=machines))
