"""``migsched submit``: publish one job on ``jobs.submit`` and print its id."""

from __future__ import annotations

import asyncio

import click
import msgspec

from migsched import endpoints
from shared.client import ClientError, MigschedClient, demand_of


@click.command("submit", context_settings={"ignore_unknown_options": False})
@endpoints.options
@click.option("--profile", help="MIG profile name or shape (3g.20gb, 3g, nvidia.com/mig-1g.5gb).")
@click.option(
    "--compute", "compute_slices", type=click.IntRange(1, 8), help="Compute slices (with --memory)."
)
@click.option(
    "--memory",
    "memory_gb",
    type=click.FloatRange(min=0, min_open=True),
    help="Memory in GB (with --compute): the smallest fitting profile on each model.",
)
@click.option("--gpus", type=click.IntRange(1, 64), help="N whole GPUs on one node.")
@click.option("--shared", is_flag=True, help="A time-sliced share of a non-MIG GPU.")
@click.option("--tenant", default="default", show_default=True)
@click.option("--priority", type=click.IntRange(-1000, 1000), default=0, show_default=True)
@click.option(
    "--duration",
    "duration_s",
    type=float,
    help="Duration hint in seconds (the sim backend runs the job this long).",
)
@click.option("--latency-sensitive", is_flag=True, help="Never moved across GPUs.")
@click.option("--no-migrate", is_flag=True, help="Never moved at all.")
@click.option("--patience", "patience_s", type=float, help="Reject the job if it waits longer than this.")
@click.option("--job-id", help="Choose the id (re-submitting a known id is a no-op).")
@click.option(
    "--wait",
    "wait_s",
    type=float,
    help="Wait up to this many seconds for the job to end; print its final state (needs Redis).",
)
@click.argument("argv", nargs=-1)
def command(
    nats_url: str,
    redis_url: str,
    namespace: str,
    profile: str | None,
    compute_slices: int | None,
    memory_gb: float | None,
    gpus: int | None,
    shared: bool,
    tenant: str,
    priority: int,
    duration_s: float | None,
    latency_sensitive: bool,
    no_migrate: bool,
    patience_s: float | None,
    job_id: str | None,
    wait_s: float | None,
    argv: tuple[str, ...],
) -> None:
    """Submit one job: exactly one of --profile, --compute + --memory, --gpus N or --shared.

    ARGV (after --) is the workload the executor runs bound to the job's instance."""
    try:  # a malformed request fails here, before any connection
        demand = demand_of(
            profile=profile, compute_slices=compute_slices, memory_gb=memory_gb, gpus=gpus, shared=shared
        )
        msg = MigschedClient.job(
            job_id=job_id,
            demand=demand,
            tenant=tenant,
            priority=priority,
            duration_s=duration_s,
            latency_sensitive=latency_sensitive,
            migratable=not no_migrate,
            patience_s=patience_s,
            argv=argv,
        )
    except (ClientError, msgspec.ValidationError) as exc:
        raise click.UsageError(str(exc)) from None

    async def run() -> None:
        async with MigschedClient(
            nats_url, namespace=namespace, redis_url=redis_url if wait_s is not None else None
        ) as c:
            jid = await c.submit(
                job_id=msg.job_id,
                demand=msg.demand,
                tenant=tenant,
                priority=priority,
                duration_s=duration_s,
                latency_sensitive=latency_sensitive,
                migratable=not no_migrate,
                patience_s=patience_s,
                argv=argv,
            )
            click.echo(jid)
            if wait_s is not None:
                click.echo(await c.wait(jid, timeout=wait_s))

    asyncio.run(run())
