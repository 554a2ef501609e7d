"""``migsched up --demo``: replay a short workload into the stack just started, draw the slices filling and
emptying, and print the live KPIs next to the simulator's for the same input.

The demo's executors run their GPUs in MIG mode, so it replays the jobs those take (``replayer.on_mig_gpus``):
MIG instances and whole GPUs, gangs across nodes included; ``migsched replay`` publishes every kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from migsched import clusterview, livekpis, replayer
from migsched.stack import MODEL, Stack, gpus_per_node, stop_event
from shared.errors import MigschedError
from shared.mig.geometry import default_geometry
from shared.sim.jobs import Workload
from shared.state import TERMINAL_STATES

if TYPE_CHECKING:
    from migsched.replayer import Replay
    from shared.state import RedisState


def workload(trace: str, limit: int, seed: int, n_gpus: int) -> tuple[Workload, dict[str, int]]:
    """The jobs the demo replays (those GPUs in MIG mode take) and a count of those it leaves out; a usage error
    when the trace cannot be read or leaves nothing to replay."""
    try:
        loaded = replayer.load(trace, default_geometry().model(MODEL), limit=limit, seed=seed, gpus=n_gpus)
    except MigschedError as exc:
        raise click.BadParameter(str(exc), param_hint="--trace") from None
    workload, skipped = replayer.on_mig_gpus(loaded)
    if not workload.jobs:
        raise click.BadParameter(f"{trace!r} has no job that GPUs in MIG mode run, the only kind the demo replays "
                                 f"(left out: {skipped}); `migsched replay` publishes every kind", param_hint="--trace")
    return workload, skipped


async def run(
    stack: Stack,
    console: Console,
    workload: Workload,
    skipped: dict[str, int],
    speedup: float,
    json_out: Path | None,
    keep: bool,
    timeout_s: float,
) -> int:
    from shared.client import MigschedClient
    from shared.state import RedisState

    geometry = default_geometry()
    console.print(
        f"workload {workload.name}: {len(workload.jobs)} jobs over "
        f"{workload.jobs[-1].arrival - workload.jobs[0].arrival:,.0f} trace seconds at {speedup:g}x"
        + (f"; left out: {skipped}" if skipped else "")
    )
    await stack.wait_ready()
    stop = stop_event()
    state = RedisState.from_settings(stack.client_settings())
    client = MigschedClient(stack.nats_url, namespace=stack.config.namespace)
    await client.connect()
    sampler = livekpis.Sampler(state, geometry, workload)
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    )
    published = progress.add_task("submitted", total=len(workload.jobs))
    ids = [j.id for j in workload.jobs]
    t0 = time.time()
    sampling = asyncio.create_task(sampler.run())
    replaying = asyncio.create_task(
        replayer.replay(
            client, workload, speedup, progress=lambda i, n: progress.update(published, completed=i)
        )
    )
    try:
        finished = await _watch(stack, console, state, ids, progress, replaying, stop, (t0, timeout_s))
        replay = await replaying if replaying.done() else None
        sampler.stop()
        await sampling
        if replay is None:
            replaying.cancel()
            return 130 if stop.is_set() else 1
        wall = time.time() - t0
        live_k = await _live_kpis(stack, state, workload, replay, sampler, wall)
        per_node = gpus_per_node(stack.config.gpus)
        sim_k = livekpis.simulate(workload, stack.config.executors, per_node, MODEL)
        if not console.is_terminal:  # the live view's last line, written to a file or pipe, ends without one
            console.line()
        console.print(kpi_table(live_k, sim_k, speedup))
        if json_out is not None:
            report = {"live": live_k, "simulator": sim_k, "speedup": speedup, "workload": workload.name,
                      "skipped": skipped}
            json_out.write_text(json.dumps(report, indent=2))
        return 0 if finished else 1
    finally:
        await client.close()
        await state.close()


async def _watch(stack: Stack, console: Console, state: RedisState, ids: list[str], progress: Progress,
                 replaying: asyncio.Task[Replay], stop: asyncio.Event, limit: tuple[float, float]) -> bool:
    """Draw the cluster and the progress until every job has ended (True), the time ``limit`` (start, seconds)
    passes or a stop is asked for."""
    t0, timeout_s = limit
    geometry = default_geometry()
    ended = progress.add_task("ended", total=len(ids))
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while not stop.is_set():
            stack.check_alive()
            view = await clusterview.read(state, geometry)
            done = sum(1 for j in ids if view.jobs.get(j) in TERMINAL_STATES)
            progress.update(ended, completed=done)
            title = f"migsched demo ({stack.config.namespace})"
            live.update(Group(clusterview.render(view, show_jobs=0, title=title, compact=True), progress))
            if replaying.done() and done >= len(ids):
                return True
            if time.time() - t0 > timeout_s:
                console.print(f"[yellow]timed out after {timeout_s:.0f}s with {len(ids) - done} jobs open[/]")
                return False
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)
    return False


async def _live_kpis(stack: Stack, state: RedisState, workload: Workload, replay: Replay,
                     sampler: livekpis.Sampler, wall: float) -> dict[str, float | int]:
    """The KPIs of the live run: the jobs' outcomes, the sampled occupancy, the executors' reconfigurations."""
    ids = [j.id for j in workload.jobs]
    outcomes = await livekpis.outcomes(state, ids)
    reconf = sum(
        int(livekpis.scrape(port, "migsched_executor_reconfigurations_total"))
        for name, port in stack.metrics_ports.items()
        if name.startswith("executor")
    )
    n_gpus = gpus_per_node(stack.config.gpus) * stack.config.executors
    return livekpis.kpis(workload, replay, outcomes, sampler.samples, default_geometry(), MODEL, n_gpus,
                         reconfigurations=reconf, wall_s=wall)




def kpi_table(live: dict[str, float | int], sim: dict[str, float | int], speedup: float) -> Table:
    t = Table(title=f"KPIs (trace seconds; live stack replayed at {speedup:g}x)", title_justify="left")
    t.add_column("KPI")
    t.add_column("live stack", justify="right")
    t.add_column("simulator", justify="right")
    for k in livekpis.KPI_KEYS + (livekpis.GANG_KEYS if live.get("gangs") else ()):
        a, b = live.get(k, ""), sim.get(k, "")
        t.add_row(
            k,
            f"{a:,.4g}" if isinstance(a, float) else str(a),
            f"{b:,.4g}" if isinstance(b, float) else str(b),
        )
    return t
