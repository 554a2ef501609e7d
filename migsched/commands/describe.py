"""``migsched describe JOB``: one job from the state store: what it asked for, where it is, why it waits, and
its history (every transition with its reason; a placement's reason carries its score, reasons and
runners-up).

Exit status: 0 the job is known, 1 it is not.
"""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import UTC, datetime
from typing import Any

import click
import msgspec

from migsched import endpoints
from migsched.clusterview import all_holds, job_row
from shared.events import JobSubmit
from shared.state import JobRecord, RedisState
from shared.state.model import TERMINAL_STATES


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z" if t else "-"


async def gather(state: RedisState, job_id: str) -> dict[str, Any] | None:
    """The job's record, its decoded submit, its history and any reservation held for it (None: unknown)."""
    rec = await state.job(job_id)
    if rec is None:
        return None
    spec: JobSubmit | None = None
    if rec.spec:
        try:
            spec = msgspec.json.decode(rec.spec, type=JobSubmit)
        except msgspec.DecodeError:
            spec = None
    holds = [h for h in await all_holds(state) if h.job_id == job_id]
    return {"record": rec, "spec": spec, "history": await state.history(job_id), "holds": holds}


def render(info: dict[str, Any], now: float) -> str:
    rec, spec = info["record"], info["spec"]
    since = job_row(rec).since
    lines = [f"job {rec.job_id}: {rec.state}" + (f" (submitted {now - since:.0f} s ago)" if since else "")]
    if spec is not None:
        lines.append(
            f"  asks {spec.demand.label()} for tenant {spec.tenant}, priority {_priority(rec, spec)}"
            + (f", hint {spec.duration_hint_s:g} s" if spec.duration_hint_s else "")
            + (f", patience {spec.patience_s:g} s" if spec.patience_s else "")
        )
    lines.append(f"  attempts {rec.attempts}, preempted {rec.preempted}")
    by_node: dict[str, list[str]] = {}
    for g, i in rec.held():  # an instance id repeats its GPU's: only what it adds
        by_node.setdefault(g.rpartition("/")[0] or rec.node or "?", []).append(f"{g} ({i.removeprefix(g + ':')})")
    verb = "ran on" if rec.state in TERMINAL_STATES else "holds on"  # an ended job's record keeps where it ran
    for node, gpus in by_node.items():  # a gang across nodes: a line per member node, in rank order
        lines.append(f"  {verb} {node}: " + ", ".join(gpus))
    if rec.state == "pending":
        lines.append(f"  why it waits: {rec.reason or 'not decided yet'}")
    for h in info["holds"]:
        lines.append(f"  reserved: {h.explain(now)}")
    lines.append("history:")
    for e in info["history"]:
        lines.append(f"  {_when(e.at)}  {e.prev or '-'} -> {e.to}" + (f": {e.reason}" if e.reason else ""))
    return "\n".join(lines)


def _priority(rec: JobRecord, spec: JobSubmit) -> str:
    """The priority the scheduler ranks the job by: with a tenancy file, its priority class's value (recorded when
    it was queued or placed), not the submit's own number."""
    prio = rec.prio if rec.at else spec.priority  # a job rejected on arrival was never ranked
    if spec.priority_class:
        return f"{prio} (class {spec.priority_class})"
    return f"{prio} (by priority class)" if prio != spec.priority else str(prio)


@click.command("describe")
@endpoints.options
@click.option("--json", "as_json", is_flag=True, help="The record, submit, history and holds as JSON.")
@click.argument("job_id")
def command(nats_url: str, redis_url: str, namespace: str, as_json: bool, job_id: str) -> None:
    """Show one job: its demand, where it runs or why it waits, and every transition with its reason."""

    async def run() -> dict[str, Any] | None:
        state = await endpoints.open_state(endpoints.settings(nats_url, redis_url, namespace))
        try:
            return await gather(state, job_id)
        finally:
            await state.close()

    info = asyncio.run(run())
    if info is None:
        where = f"namespace {namespace!r}" if namespace else "the default namespace"
        click.echo(f"unknown job: {job_id} (not in {where})", err=True)
        sys.exit(1)
    if as_json:
        data = {**info, "record": msgspec.structs.replace(info["record"], spec=b"")}
        click.echo(msgspec.json.encode(data).decode())
        return
    click.echo(render(info, time.time()))
