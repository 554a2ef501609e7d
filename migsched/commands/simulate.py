"""``migsched simulate``: replay a workload through one or more policies and write a report.

Examples::

    migsched simulate -w openb:default --cluster A100-40GB:48 --out out/openb
    migsched simulate -w openb:gpushare60 --cluster A100-40GB:48 \\
        --sweep-threshold 0.2,0.3,0.4,0.5,0.6 --out out/sweep
    migsched simulate -w openb:default --cluster A100-40GB:48 --ablation --out out/ablation
    migsched simulate -w csv:jobs.csv \\
        --csv-map arrival=submit_ts,duration=runtime,gpu_fraction=gpu,tenant=user \\
        --cluster H100-80GB:16 --policy migsched --policy first-fit --out out/csv
    migsched simulate --matrix --out out/matrix      # every policy over every trace, size and seed
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from migsched.commands.simulate_modes import command_line, config, params_text, run_matrix, run_tenancy
from shared.errors import MigschedError


def _floats(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of numbers") from None
    if not vals or any(not 0 < v <= 1 for v in vals):
        raise click.BadParameter("thresholds must be in (0, 1]")
    return vals


def _progress(enabled: bool) -> tuple[Callable[[str, int, int], None] | None, contextlib.AbstractContextManager[Any]]:
    """A progress callback and the bar to run it under (None and a no-op when disabled)."""
    if not enabled:
        return None, contextlib.nullcontext()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("{task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs"),
        TimeElapsedColumn(),
        transient=False,
    )
    tasks: dict[str, TaskID] = {}

    def update(label: str, done: int, total: int) -> None:
        if label not in tasks:
            tasks[label] = bar.add_task(label, total=total)
        bar.update(tasks[label], completed=done)

    return update, bar


@click.command("simulate")
@click.option(
    "-w",
    "--workload",
    default="openb:default",
    show_default=True,
    help="openb[:VARIANT|PATH] | dlrm | itp:cluster01..10 | csv:PATH | synthetic[:default|gangs] (gangs: 16- to "
         "128-GPU jobs too)",
)
@click.option(
    "--csv-map",
    default=None,
    help="column mapping for csv:, e.g. arrival=submit_ts,duration=runtime,"
    "gpu_fraction=gpu,tenant=user,priority=prio; workers=COLUMN makes each job a gang of its workers "
    "(see docs/simulator.md)",
)
@click.option(
    "--dlrm-gpus",
    type=float,
    default=0.0,
    help="add DLRM background load of about this many whole "
    "GPUs (for -w dlrm alone: default half the cluster)",
)
@click.option(
    "--jobs", "n_jobs", type=int, default=10_000, show_default=True, help="synthetic: number of jobs"
)
@click.option(
    "--load",
    type=float,
    default=0.9,
    show_default=True,
    help="synthetic: offered load (share of the cluster's compute)",
)
@click.option(
    "--time-scale",
    type=float,
    default=1.0,
    show_default=True,
    help="openb: divide arrival gaps by this (raises the offered load)",
)
@click.option(
    "--window", default="auto", show_default=True, help="openb: auto | all | START:END trace seconds"
)
@click.option("--jitter", "jitter_s", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="shift each arrival by up to this many seconds either way, drawn from --seed (0: as recorded)")
@click.option("--limit", type=int, default=None, help="replay only the first N jobs")
@click.option("--cluster", "clusters", multiple=True, help="MODEL:COUNT, repeatable (default A100-40GB:48)")
@click.option("--gpus-per-node", type=int, default=8, show_default=True)
@click.option("--block-nodes", type=click.IntRange(min=0), default=0, show_default=True,
              help="every N nodes form a topology block (0: no blocks)")
@click.option("--gang-topology", type=click.Choice(["block", "block:required"]), default=None,
              help="keep every gang (gpus > 1) within one block: preferred, or required")
@click.option(
    "--nodes-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="CSV of nodes: node|sn, gpus|gpu, model",
)
@click.option("--nodes-model", default=None, help="map every node of --nodes-file to this MIG model")
@click.option(
    "-p",
    "--policy",
    "policies",
    multiple=True,
    help="policy name, repeatable; 'all' = every policy (default: all unless --sweep/--ablation)",
)
@click.option("--threshold", type=float, default=0.4, show_default=True, help="load threshold t")
@click.option("--cooldown", type=float, default=120.0, show_default=True, help="migration cooldown (s)")
@click.option("--max-moves", type=int, default=4, show_default=True, help="moves per migration plan")
@click.option(
    "--reconfig-latency",
    type=float,
    default=0.15,
    show_default=True,
    help="seconds per GPU-instance create or destroy",
)
@click.option(
    "--migration-downtime", type=float, default=2.0, show_default=True, help="seconds lost per move"
)
@click.option(
    "--checkpoint",
    type=float,
    default=600.0,
    show_default=True,
    help="checkpoint interval (s): a move loses the progress since the last one; 0 = none",
)
@click.option("--defrag-interval", type=float, default=300.0, show_default=True, help="periodic defrag (s)")
@click.option(
    "--patience",
    type=float,
    default=3600.0,
    show_default=True,
    help="queue patience (s) before a job is rejected; 'inf' never",
)
@click.option("--beta", type=float, default=0.5, show_default=True, help="interference strength (0 = none)")
@click.option(
    "--static-layout",
    default="mix",
    show_default=True,
    help="layout of static baselines: mix (sized to the workload) | all-balanced | all-<shape>",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--hint-factor",
    type=float,
    default=1.0,
    show_default=True,
    help="each job's duration hint is its run time times this (> 1: users overestimate); 0 = no hints",
)
@click.option(
    "--reserve-after",
    type=float,
    default=1200.0,
    show_default=True,
    help="a large job (whole GPUs) that fits on one node and has waited this long gets a reservation (policies "
    "that reserve); a gang bigger than every node gets one at once",
)
@click.option("--max-reservations", type=int, default=2, show_default=True, help="reservations held at once")
@click.option(
    "--reserve-slack",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="a job may take a held GPU if its hint ends at most this many seconds after the hold's expected start "
    "(relaxed backfill); 0 = only if it ends before",
)
@click.option(
    "--default-hint",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="seconds a job without a hint is expected to run, for planning holds (MIGSCHED_DEFAULT_HINT_S); 0 = "
    "unknown",
)
@click.option("--sweep-threshold", default=None, help="run paper at each t, e.g. 0.2,0.3,0.4,0.5,0.6")
@click.option(
    "--sweep-policy",
    default="paper",
    show_default=True,
    help="policy the threshold sweep runs (paper, paper-nomig, paper-pack or lb-static)",
)
@click.option("--ablation", is_flag=True, help="run lb-static -> paper-nomig -> paper (the seeds' scheme)")
@click.option(
    "--matrix",
    is_flag=True,
    help="the benchmark matrix: every -p policy (default: the baselines, paper, migsched and fluid) over the "
    "openb traces at three sizes, the synthetic mix at three loads and five seeds, and openb with DLRM; "
    "writes matrix.md, matrix.json and matrix.png (docs/simulator.md)",
)
@click.option("--quick", is_flag=True, help="with --matrix: one size per trace and one seed")
@click.option("--workers", type=int, default=1, show_default=True, help="with --matrix: processes to run cells in")
@click.option("--check-invariants", is_flag=True, help="check the state at every event (slow)")
@click.option(
    "--tenancy",
    "tenancy_file",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="tenancy file (quotas, cohorts, priority classes; docs/operations.md, Tenancy): quota -> place -> preempt, "
    "fair-share queue, per-tenant report (policies paper / paper-nomig: the balancer's placement)",
)
@click.option(
    "--teams",
    default=None,
    help="with --tenancy: give jobs synthetic tenants, e.g. team-a,team-b,team-c (crc32 of the job id); "
    "each job's class is qos-<its old tenant, lower case> (openb: its QoS)",
)
@click.option("--reserve-full", type=int, default=0, show_default=True, help="with --tenancy: GPUs kept free")
@click.option("--no-preempt", is_flag=True, help="with --tenancy: never preempt")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="sim-out", show_default=True)
@click.option("--progress/--no-progress", default=True, show_default=True)
def command(**o: Any) -> None:
    """Replay a workload through scheduling policies on a simulated MIG cluster; write report.md, kpis.json,
    series.json and PNG plots to --out."""
    try:
        _run(o)
    except MigschedError as exc:
        raise click.ClickException(str(exc)) from None


def _run(o: dict[str, Any]) -> None:
    if o["matrix"]:
        run_matrix(o)
        return

    from shared.mig.geometry import default_geometry
    from shared.policy.placement.registry import parse_label, policy_names
    from shared.sim import experiment, report
    from shared.sim.cluster import load_nodes_file, parse_cluster
    from shared.sim.fluid import NAME as FLUID
    from shared.sim.workloads.spec import WorkloadSpec, build, within_blocks

    geo = default_geometry()
    if o["nodes_file"]:
        cluster = load_nodes_file(str(o["nodes_file"]), geo, o["nodes_model"])
    else:
        cluster = parse_cluster(list(o["clusters"]) or ["A100-40GB:48"], geo, int(o["gpus_per_node"]),
                                int(o["block_nodes"]))
    seed = int(o["seed"])
    workload = build(
        WorkloadSpec(
            name=str(o["workload"]), seed=seed, jobs=int(o["n_jobs"]), load=float(o["load"]),
            window=str(o["window"]), time_scale=float(o["time_scale"]), limit=o["limit"],
            csv_map=str(o["csv_map"] or ""), dlrm_gpus=float(o["dlrm_gpus"]), jitter_s=float(o["jitter_s"]),
        ),
        cluster,
        geo,
    )
    if o["gang_topology"]:
        workload = within_blocks(workload, required=o["gang_topology"] == "block:required")
    patience = float(o["patience"])
    cfg = config(o, seed, patience)
    names = list(o["policies"])
    if not names and not o["sweep_threshold"] and not o["ablation"]:
        names = ["all"]
    if "all" in names:
        names = [*policy_names(), FLUID]
    known = [*policy_names(), FLUID]
    bad = [n for n in names if parse_label(n)[0] not in known]
    if bad:
        raise click.BadParameter(
            f"unknown policy {', '.join(bad)}; known: {', '.join(known)}", param_hint="--policy"
        )
    if o["tenancy_file"]:
        run_tenancy(o, workload, cluster, cfg, geo, [n for n in names if n != "all"] or ["paper"])
        return
    out = Path(str(o["out_dir"]))
    cmd = command_line()
    update, bar = _progress(bool(o["progress"]))
    sections: list[report.Section] = []
    kw: dict[str, Any] = {"geometry": geo, "progress": update}
    with bar:
        if names:
            runs = experiment.compare(workload, cluster, names, cfg, **kw)
            sections.append(report.Section(title="Policies compared", kind="compare", runs=runs, command=cmd))
        if o["sweep_threshold"]:
            ts = _floats(str(o["sweep_threshold"]))
            sweep_policy = str(o["sweep_policy"])
            if sweep_policy not in experiment.THRESHOLD_POLICIES:
                raise click.BadParameter(
                    f"{sweep_policy!r} takes no threshold; use one of "
                    + ", ".join(sorted(experiment.THRESHOLD_POLICIES)),
                    param_hint="--sweep-policy",
                )
            runs = experiment.sweep(workload, cluster, ts, cfg, name=sweep_policy, **kw)
            sections.append(
                report.Section(
                    title=f"Threshold sweep ({sweep_policy})",
                    kind="sweep",
                    runs=runs,
                    command=cmd,
                    prefix="sweep_",
                )
            )
        if o["ablation"]:
            runs = experiment.ablation(workload, cluster, cfg, **kw)
            sections.append(
                report.Section(
                    title="Ablation: load balancing -> + dynamic partitioning -> + migration",
                    kind="compare",
                    runs=runs,
                    command=cmd,
                    prefix="ablation_",
                )
            )
    header = [
        f"- workload: `{workload.name}`, {len(workload.jobs)} jobs; dropped: {workload.dropped or 'none'}",
        f"- cluster: {cluster.label()} ({len(cluster.nodes)} nodes)",
        f"- parameters: `{params_text(cfg)}`",
        *[f"- {n}" for n in workload.notes],
    ]
    written = report.write(out, sections, header=header)
    for s in sections:
        click.echo(report.kpi_table([r.kpis for r in s.runs]))
    click.echo(f"wrote {len(written)} files to {out}/: {', '.join(p.name for p in written)}")
