"""``migsched quota``: validate a tenancy file and show its tenants, cohorts and priority classes.

``migsched quota check FILE`` prints what the file defines, or every problem with its place in the file.
``migsched quota recount`` rebuilds each shard's tenant usage counters (what the store checks a reservation's
quota against) from its active jobs' stored charges: the repair for a ``usage`` finding of ``migsched check``.
``migsched quota show FILE`` adds each tenant's usage against its quota, read live from the cluster's state
store (every job-holding instance charged to its tenant, as the balancer charges it), or from ``--usage
USAGE.json``: ``{"tenant": {"compute_slices": 3, "memory_gib": 40, "nvidia.com/mig-2g.20gb": 1}, ...}``.
Both take ``--json``. Exit status: 0 valid, 1 invalid file, 2 usage error (unreadable usage file, or the state
store does not answer).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

import click
from redis.exceptions import RedisError
from rich.console import Console
from rich.table import Table

from migsched import endpoints
from shared.policy.quota import QuotaBook, headroom
from shared.policy.resources import Usage
from shared.tenancy import Tenancy, TenancyError, load_tenancy


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 160, soft_wrap=False)


def _num(x: float) -> str:
    return "unlimited" if math.isinf(x) else f"{x:g}"


def _load(path: str) -> Tenancy:
    try:
        return load_tenancy(path)
    except TenancyError as exc:
        click.echo(f"invalid: {exc}", err=True)
        sys.exit(1)


def _describe(t: Tenancy) -> dict[str, Any]:
    q = t.quotas
    return {
        "source": t.source,
        "unknown_tenants": q.unknown_tenants,
        "priority_classes": [
            {"name": c.name, "value": c.value, "preemption": c.preemption, "preemptible": c.preemptible,
             "default": c is t.classes.default} for c in t.classes
        ],
        "cohorts": {name: {"reclaim": q.cohort_policy(name).reclaim, "members": list(q.members.get(name, ()))}
                    for name in sorted(q.cohorts)},
        "tenants": {
            name: {"cohort": tq.cohort, "priority_class": t.tenant_classes.get(name, t.classes.default.name),
                   "quota": tq.quota, "borrowing_limit": tq.borrowing_limit,
                   "unlisted": "denied (nominal 0)" if tq.denies_unlisted() else "unlimited"}
            for name, tq in sorted(q.tenants.items())
        },
    }


@click.group(name="quota")
def command() -> None:
    """Tenant quotas, cohorts and priority classes (the MIGSCHED_TENANCY_FILE)."""


@command.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of tables")
def check(file: str, as_json: bool) -> None:
    """Validate FILE and print its tenants, cohorts and priority classes."""
    t = _load(file)
    info = _describe(t)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    out = _console()
    classes = Table(title="priority classes (highest first)")
    for col in ("name", "value", "preemption", "preemptible", "default"):
        classes.add_column(col)
    for c in info["priority_classes"]:
        classes.add_row(c["name"], str(c["value"]), c["preemption"], str(c["preemptible"]),
                        "yes" if c["default"] else "")
    out.print(classes)
    cohorts = Table(title="cohorts")
    for col in ("cohort", "reclaim", "members"):
        cohorts.add_column(col)
    for name, c in info["cohorts"].items():
        cohorts.add_row(name, c["reclaim"], ", ".join(c["members"]) or "(none)")
    out.print(cohorts)
    tenants = Table(title=f"tenants (absent tenants: {info['unknown_tenants']})")
    for col in ("tenant", "cohort", "class", "quota", "borrowing limit", "unlisted resources"):
        tenants.add_column(col)
    for name, tq in info["tenants"].items():
        quota = ", ".join(f"{r}={v:g}" for r, v in tq["quota"].items()) or "(none)"
        limit = tq["borrowing_limit"]
        borrow = "n/a" if tq["cohort"] is None else (
            "unlimited" if limit is None else ", ".join(f"{r}={v:g}" for r, v in limit.items()) or "none")
        tenants.add_row(name, tq["cohort"] or "-", tq["priority_class"], quota, borrow, tq["unlisted"])
    out.print(tenants)
    click.echo(f"{file}: valid ({len(info['tenants'])} tenants, {len(info['cohorts'])} cohorts, "
               f"{len(info['priority_classes'])} priority classes)")


def live_usage(nats_url: str, redis_url: str, namespace: str) -> dict[str, Usage]:
    """Each tenant's usage now: the cluster's job-holding instances, charged as the balancer charges them."""
    from services.balancer.tenancy import TenantLedger
    from shared.mig.geometry import default_geometry
    from shared.policy.snapshot import snapshot_of

    async def run() -> dict[str, Usage]:
        state = await endpoints.open_state(endpoints.settings(nats_url, redis_url, namespace))
        try:
            gpus = await state.load_gpus()
        finally:
            await state.close()
        ledger = TenantLedger("", reserve_full=0)
        ledger.rebuild([snapshot_of(default_geometry(), [g.view() for g in gpus])])
        return ledger.usage()

    return asyncio.run(run())


@command.command()
@endpoints.options
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--usage", "usage_file", type=click.Path(dir_okay=False), default=None,
              help="JSON: tenant -> resource -> amount in use [default: read live from the state store]")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
def show(nats_url: str, redis_url: str, namespace: str, file: str, usage_file: str | None, as_json: bool) -> None:
    """Each tenant's usage against its quota (used / nominal / with borrowing), live or from --usage."""
    t = _load(file)
    used: dict[str, Usage] = {}
    if not usage_file:
        try:
            used = live_usage(nats_url, redis_url, namespace)
        except (OSError, RedisError) as exc:
            click.echo(f"error: cannot read live usage from {endpoints.safe_url(redis_url)}: {exc} "
                       "(or give --usage FILE)", err=True)
            sys.exit(2)
    else:
        try:
            raw = json.loads(Path(usage_file).read_text())
            used = {str(k): Usage({str(r): float(v) for r, v in dict(u).items()})
                    for k, u in dict(raw).items()}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            click.echo(f"error: cannot read usage file {usage_file}: {exc}", err=True)
            sys.exit(2)
    book = QuotaBook(t.quotas, used)
    rows: list[dict[str, Any]] = []
    for name in sorted(set(t.quotas.tenants) | set(used)):
        borrowed = book.borrowed(name)
        limits = headroom(book, name) or {r: (v, math.inf, math.inf) for r, v in book.used(name).items()}
        for r, (u, nom, top) in limits.items():
            rows.append({"tenant": name, "resource": r, "used": u, "quota": nom, "max_with_borrowing": top,
                         "borrowed": borrowed.amount(r)})
    if as_json:
        finite = [{k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in r.items()}
                  for r in rows]
        click.echo(json.dumps(finite, indent=2))
        return
    table = Table(title="usage against quota")
    for col in ("tenant", "resource", "used", "quota", "max with borrowing", "borrowed"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["tenant"], row["resource"], _num(row["used"]), _num(row["quota"]),
                      _num(row["max_with_borrowing"]), _num(row["borrowed"]) if row["borrowed"] else "")
    _console().print(table)


@command.command()
@endpoints.options
@click.option("--shards", type=int, default=None,
              help="Shards of the deployment (default: MIGSCHED_SHARDS, else the count its services recorded).")
def recount(nats_url: str, redis_url: str, namespace: str, shards: int | None) -> None:
    """Rebuild each shard's tenant usage counters from its active jobs' stored charges (the repair for a
    ``usage`` finding of ``migsched check``). Writes: needs a Redis user that may run scripts."""

    st = endpoints.settings(nats_url, redis_url, namespace)

    async def run() -> list[int]:
        state = await endpoints.open_state(st, shards)
        try:
            await state.load_scripts()
            return [await state.recount_usage(s) for s in range(state.shards)]
        finally:
            await state.close()

    try:
        counted = asyncio.run(run())
    except (OSError, RedisError) as exc:
        click.echo(f"error: cannot recount usage in {endpoints.safe_url(redis_url)}: {exc}", err=True)
        sys.exit(2)
    for s, n in enumerate(counted):
        click.echo(f"shard {s}: {n} active job(s) of a tenant counted")
