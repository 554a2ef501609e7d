"""The ``migsched simulate`` modes beside a plain comparison: the benchmark matrix and tenancy runs, and what
every mode's report states (the command line, the run's parameters)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import click


def command_line() -> str:
    """The command as typed, for a report to repeat ("" when run without arguments)."""
    return "migsched simulate " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 2 else ""


def config(o: dict[str, Any], seed: int, patience: float) -> Any:
    """The run's ``SimConfig`` from the command's options."""
    from shared.sim.config import InterferenceParams, SimConfig

    return SimConfig(
        seed=seed,
        threshold=float(o["threshold"]),
        reconfig_latency_s=float(o["reconfig_latency"]),
        migration_downtime_s=float(o["migration_downtime"]),
        checkpoint_s=float(o["checkpoint"]),
        cooldown_s=float(o["cooldown"]),
        defrag_interval_s=float(o["defrag_interval"]),
        max_moves=int(o["max_moves"]),
        patience_s=patience,
        static_layout=str(o["static_layout"]),
        interference=InterferenceParams(beta=float(o["beta"])),
        check_invariants=bool(o["check_invariants"]),
        hint_factor=float(o["hint_factor"]),
        reserve_after_s=float(o["reserve_after"]),
        max_reservations=int(o["max_reservations"]),
        reserve_slack_s=float(o["reserve_slack"]),
        default_hint_s=float(o["default_hint"]),
    )


def run_matrix(o: dict[str, Any]) -> None:
    from shared.sim import matrix

    cfg = config(o, int(o["seed"]), float(o["patience"]))
    labels = list(o["policies"]) or list(matrix.DEFAULT_POLICIES)
    cells = matrix.cells(quick=bool(o["quick"]))
    done = [0]

    def progress(cell: matrix.Cell) -> None:
        done[0] += 1
        if o["progress"]:
            click.echo(f"[{done[0]}/{len(cells)}] {cell.group}", err=True)

    runs = matrix.run_matrix(cells, labels, cfg, workers=max(1, int(o["workers"])), progress=progress)
    out = Path(str(o["out_dir"]))
    written = matrix.write(out, runs, command=command_line())
    click.echo((out / "matrix.md").read_text())
    click.echo(f"wrote {', '.join(p.name for p in written)} to {out}/")


def run_tenancy(
    o: dict[str, Any], workload: Any, cluster: Any, cfg: Any, geo: Any, names: list[str]
) -> None:
    from shared.sim import report
    from shared.sim.tenancy import run_tenancy, synthetic_tenants, tenant_table
    from shared.tenancy import load_tenancy

    tenancy = load_tenancy(str(o["tenancy_file"]), geo)
    classes: dict[str, str] = {}
    if o["teams"]:
        workload, classes = synthetic_tenants(workload, [t for t in str(o["teams"]).split(",") if t])
    runs = [
        run_tenancy(
            workload,
            cluster,
            n,
            cfg,
            tenancy,
            classes=classes,
            reserve_full=int(o["reserve_full"]),
            preempt=not o["no_preempt"],
            geometry=geo,
        )
        for n in names
    ]
    cmd = command_line()
    table = tenant_table(runs)
    header = [
        f"- workload: `{workload.name}`, {len(workload.jobs)} jobs; dropped: {workload.dropped or 'none'}",
        f"- cluster: {cluster.label()} ({len(cluster.nodes)} nodes)",
        f"- parameters: `{params_text(cfg)}`; tenancy `{o['tenancy_file']}`, reserve {o['reserve_full']}",
        "",
        "## Tenants",
        "",
        table,
    ]
    out = Path(str(o["out_dir"]))
    sections = [report.Section(title="Tenancy", kind="compare", runs=runs, command=cmd)]
    written = report.write(out, sections, header=header)
    click.echo(report.kpi_table([r.kpis for r in runs]))
    click.echo(table)
    click.echo(f"wrote {len(written)} files to {out}/: {', '.join(p.name for p in written)}")


def params_text(cfg: Any) -> str:
    import msgspec

    d = msgspec.to_builtins(cfg)
    d.pop("interference", None)
    beta = cfg.interference.beta
    return ", ".join(f"{k}={v}" for k, v in d.items()) + f", beta={beta}"
