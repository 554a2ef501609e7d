"""``migsched dlq``: the dead-lettered messages with their reasons; ``dlq replay SEQ`` puts one back.

Exit status: 0 fine (``list`` also when the queue is empty), 1 the sequence to replay is unknown.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click
import msgspec

from migsched import endpoints
from shared.bus import JetStreamBus
from shared.deadletters import DeadLetter, DeadLetterError, letters, replay
from shared.settings import Settings

T = TypeVar("T")


@click.group("dlq", invoke_without_command=True)
@endpoints.options
@click.pass_context
def command(ctx: click.Context, nats_url: str, redis_url: str, namespace: str) -> None:
    """Dead-lettered messages: `list` (the default) or `replay SEQ` (`migsched dlq --namespace NS replay 7`)."""
    ctx.obj = endpoints.settings(nats_url, redis_url, namespace)
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_cmd)


def _run(work: Callable[[JetStreamBus], Awaitable[T]]) -> T:
    settings = click.get_current_context().find_object(Settings)
    assert settings is not None

    async def run() -> T:
        bus = await JetStreamBus.connect(settings, name="migsched-dlq", give_up_s=settings.connect_give_up_s or None)
        try:
            return await work(bus)
        finally:
            await bus.close()

    return asyncio.run(run())


def _line(d: DeadLetter, now: float) -> str:
    age = f"{now - d.failed_at:.0f}s ago" if d.failed_at else "?"
    return f"{d.seq:>6}  {d.subject}  {age}  by {d.consumer or '?'} after {d.deliveries}: {d.reason}"


@command.command("list")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True, help="The newest N.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def list_cmd(limit: int = 100, as_json: bool = False) -> None:
    """List dead letters, oldest first: sequence, original subject, age, consumer, deliveries, reason."""

    async def work(bus: JetStreamBus) -> list[DeadLetter]:
        return [d async for d in letters(bus, limit)]

    found = _run(work)
    if as_json:
        for d in found:
            click.echo(msgspec.json.encode(d).decode())
        return
    if not found:
        click.echo("no dead letters")
        return
    now = time.time()
    for d in found:
        click.echo(_line(d, now))
        click.echo(f"        {json.dumps(d.preview)[1:-1]}")


@command.command("replay")
@click.option("--keep", is_flag=True, help="Leave it in the dead-letter stream too.")
@click.argument("seq", type=int)
def replay_cmd(keep: bool, seq: int) -> None:
    """Publish dead letter SEQ again on its original subject (after fixing what refused it)."""

    async def work(bus: JetStreamBus) -> DeadLetter | str:
        try:
            return await replay(bus, seq, keep)
        except DeadLetterError as exc:
            return str(exc)

    got = _run(work)
    if isinstance(got, str):
        click.echo(f"error: {got}", err=True)
        sys.exit(1)
    click.echo(f"replayed {seq} on {got.subject}{' (kept in the dead-letter stream)' if keep else ''}")
