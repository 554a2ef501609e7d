"""``migsched replay <trace>``: publish a trace's arrivals into a running stack at a speed-up, with a
progress bar.

Times are divided by the speed-up before they are published (arrival gaps, duration hints, patience), because
the live stack runs on wall time; see ``migsched.replayer``.
"""

from __future__ import annotations

import asyncio
import json

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from migsched import endpoints, replayer
from shared.client import MigschedClient
from shared.mig.geometry import default_geometry


@click.command("replay")
@endpoints.options
@click.argument("trace")
@click.option(
    "--speedup",
    type=click.FloatRange(min=0, min_open=True),
    default=1000.0,
    show_default=True,
    help="Trace seconds per wall second.",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Replay only the first N jobs.")
@click.option(
    "--mapping",
    default=None,
    help="Generic CSV: column mapping, e.g. 'arrival=submit,duration=run,gpu_fraction=gpu'.",
)
@click.option("--window", default="auto", show_default=True, help="openb: auto, all or START:END.")
@click.option("--model", default="A100-40GB", show_default=True, help="GPU model the fractions map onto.")
@click.option(
    "--jobs", "synthetic_jobs", type=int, default=200, show_default=True, help="synthetic: number of jobs."
)
@click.option(
    "--load", "load_factor", type=float, default=0.8, show_default=True, help="synthetic: offered load."
)
@click.option(
    "--gpus", type=int, default=16, show_default=True, help="synthetic: cluster size it is sized for."
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--prefix", default="", help="Prepended to every job id (replay the same trace twice).")
@click.option("--mig-only", is_flag=True,
              help="Leave gangs (n whole GPUs) and time-sliced shares out: one MIG instance a job.")
@click.option("--whole-as-gpus", is_flag=True,
              help="Publish each one-GPU job (the model's full-size MIG profile, e.g. 7g) as gpus: 1, which GPUs "
              "not in MIG mode take too.")
@click.option("--dry-run", is_flag=True, help="Load and summarise the trace; publish nothing.")
def command(
    nats_url: str,
    redis_url: str,
    namespace: str,
    trace: str,
    speedup: float,
    limit: int | None,
    mapping: str | None,
    window: str,
    model: str,
    synthetic_jobs: int,
    load_factor: float,
    gpus: int,
    seed: int,
    prefix: str,
    mig_only: bool,
    whole_as_gpus: bool,
    dry_run: bool,
) -> None:
    """Publish TRACE's arrivals on jobs.submit: 'synthetic' (or 'synthetic:gangs', the simulator's mix with 16- to
    128-GPU gangs), an openb pod list (a path or a variant name such as 'default' or 'gpushare40', read from
    MIGSCHED_TRACES_DIR), or any CSV with --mapping."""
    if whole_as_gpus and mig_only:
        raise click.UsageError("--whole-as-gpus publishes one-GPU jobs as gangs of one, which --mig-only leaves "
                               "out: give one of the two")
    m = default_geometry().model(model)
    loaded = replayer.load(trace, m, limit=limit, jobs=synthetic_jobs, seed=seed, load_factor=load_factor,
                           gpus=gpus, mapping=mapping, window=window)
    workload, skipped = replayer.single_instance(loaded) if mig_only else (loaded, {})
    extra: dict[str, int] = {}  # with --whole-as-gpus: how many one-GPU jobs go out as gpus: 1
    if whole_as_gpus:
        before = sum(1 for j in workload.jobs if j.demand.kind == "gpus")
        workload = replayer.whole_as_gpus(workload, m)
        extra["as_gpus"] = sum(1 for j in workload.jobs if j.demand.kind == "gpus") - before
    if not workload.jobs:
        raise click.UsageError(f"{trace}: no job the live stack can place")
    console = Console(stderr=True)
    span = workload.jobs[-1].arrival - workload.jobs[0].arrival
    console.print(
        f"{workload.name}: {len(workload.jobs)} jobs over {span:,.0f} trace seconds -> "
        f"{span / speedup:,.1f} s at {speedup:g}x"
        + (f"; left out (--mig-only): {skipped}" if skipped else "")
        + (f"; {extra['as_gpus']} one-GPU jobs as gpus: 1" if extra else "")
    )
    if dry_run:
        click.echo(
            json.dumps(
                {
                    "workload": workload.name,
                    "jobs": len(workload.jobs),
                    "span_s": span,
                    "wall_s": span / speedup,
                    "skipped": skipped,
                    **extra,
                }
            )
        )
        return

    async def run() -> replayer.Replay:
        async with MigschedClient(nats_url, namespace=namespace) as client:
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            ) as progress:
                task = progress.add_task("submitted", total=len(workload.jobs))
                return await replayer.replay(
                    client,
                    workload,
                    speedup,
                    prefix=prefix,
                    progress=lambda i, n: progress.update(task, completed=i),
                    skipped=skipped,
                )

    rep = asyncio.run(run())
    click.echo(
        json.dumps(
            {"workload": rep.workload, "jobs": rep.jobs, "speedup": rep.speedup, "skipped": rep.skipped, **extra}
        )
    )
