"""``migsched submit``: publish one job on ``jobs.submit`` and print its id.

Exit status: 0 submitted (with ``--wait``: and finished); 1 with ``--wait``, the job ended rejected, failed or
cancelled (its reason is printed); 2 a usage error; 3 with ``--wait``, it had not ended in time; 4 no running
service consumes the namespace's submits (nothing was published; ``--anyway`` queues it regardless).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import click
import msgspec

from migsched import endpoints
from shared import telemetry
from shared.client import ClientError, MigschedClient, WaitTimeout, demand_of
from shared.events import Topology


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
@click.option("--gpus", type=click.IntRange(1, 4096),
              help="N whole GPUs: on one node when one holds them, else across the fewest nodes.")
@click.option("--topology", type=click.Choice(["block", "rack", "block:required", "rack:required"]),
              help="Keep a gang within one block or rack of nodes (preferred; :required waits for one).")
@click.option("--launch", type=click.Choice(["per-gpu", "per-node"]),
              help="How a gang starts on each node: once per GPU (the default) or once per node.")
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
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE",
              help="A variable for the workload (repeatable); a node passes on only what its "
              "MIGSCHED_EXECUTOR_ENV_ALLOWLIST names.")
@click.option("--run-as", help="The user the workload runs as on its node (the executor must run as root).")
@click.option(
    "--anyway",
    is_flag=True,
    help="Publish even when no running service consumes this namespace's submits (it waits in the stream).",
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
    topology: str | None,
    launch: str | None,
    shared: bool,
    tenant: str,
    priority: int,
    duration_s: float | None,
    latency_sensitive: bool,
    no_migrate: bool,
    patience_s: float | None,
    job_id: str | None,
    wait_s: float | None,
    env: tuple[str, ...],
    run_as: str | None,
    anyway: bool,
    argv: tuple[str, ...],
) -> None:
    """Submit one job: exactly one of --profile, --compute + --memory, --gpus N or --shared.

    ARGV (after --) is the workload the executor runs bound to the job's instance."""
    try:  # a malformed request fails here, before any connection
        fields: dict[str, Any] = {
            "job_id": job_id,
            "demand": demand_of(
                profile=profile, compute_slices=compute_slices, memory_gb=memory_gb, gpus=gpus, shared=shared
            ),
            "tenant": tenant,
            "priority": priority,
            "duration_s": duration_s,
            "latency_sensitive": latency_sensitive,
            "migratable": not no_migrate,
            "patience_s": patience_s,
            "argv": argv,
            "env": _variables(env),
            "run_as": run_as,
            "topology": _topology(topology),
            "launch": launch,
        }
        fields["job_id"] = MigschedClient.job(**fields).job_id  # checked now; the same id when published
    except (ClientError, msgspec.ValidationError) as exc:
        raise click.UsageError(str(exc)) from None

    async def run() -> int:
        async with MigschedClient(
            nats_url, namespace=namespace, redis_url=redis_url if wait_s is not None else None
        ) as c:
            if not anyway and not await c.consumed():
                where = f"namespace {namespace!r}" if namespace else "the default namespace"
                click.echo(
                    f"error: no running service consumes submits in {where} on {endpoints.safe_url(nats_url)}; "
                    "nothing was published. Give the namespace `migsched up` printed (--namespace or "
                    "MIGSCHED_NAMESPACE), or --anyway to queue the job until a balancer starts.",
                    err=True,
                )
                return 4
            jid = await c.submit(**fields)
            click.echo(jid)
            if wait_s is None:
                return 0
            try:
                state = await c.wait(jid, timeout=wait_s)
            except WaitTimeout as exc:
                click.echo(f"error: {exc}", err=True)
                return 3
            if state == "finished":
                click.echo(state)
                return 0
            rec = await c.record(jid)
            reason = rec.reason if rec is not None and rec.reason else "no reason recorded"
            click.echo(f"{state}: {reason}")
            return 1

    # the job's trace starts here: its submit span goes to MIGSCHED_OTLP_ENDPOINT when that is set
    telemetry.setup("migsched-cli")
    try:
        code = asyncio.run(run())
    finally:
        telemetry.shutdown()  # flushes the submit span before the process ends
    sys.exit(code)


def _variables(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.UsageError(f"--env expects NAME=VALUE, got {pair!r}")
        out[name] = value
    return out


def _topology(choice: str | None) -> Topology | None:
    if choice is None:
        return None
    level, _, required = choice.partition(":")
    return Topology(level=level, mode="required" if required else "preferred")  # type: ignore[arg-type]
