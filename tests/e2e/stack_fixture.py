"""The stack as separate processes in a test's own namespace (``migsched.stack``), on the test's NATS and
Redis."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import msgspec

from migsched.stack import Stack, StackConfig, replay_timers
from shared.bus import JetStreamBus
from shared.events import JobExit
from shared.settings import Settings
from shared.state import RedisState


def scaled_env(speedup: float) -> dict[str, str]:
    """Policy timers on the replay's clock (``migsched.stack.replay_timers``), quiet logs."""
    return {**replay_timers(speedup), "MIGSCHED_LOG_LEVEL": "WARNING"}


@contextlib.contextmanager
def running_stack(
    namespace: str,
    nats_url: str,
    redis_url: str,
    run_dir: Path,
    *,
    speedup: float = 1.0,
    executors: int = 2,
    gpus: str = "A100-40GB:8",
    env: dict[str, str] | None = None,
) -> Iterator[Stack]:
    config = StackConfig(
        namespace=namespace,
        executors=executors,
        gpus=gpus,
        run_dir=run_dir,
        reconfig_latency_s=0.15 / speedup,
        confirm_s=1.0 / speedup,
        heartbeat_s=0.5,
        stream_storage="memory",
        env={**scaled_env(speedup), **(env or {})},
    )
    stack = Stack(config)
    # the test's servers, whichever the resolution order found (an env URL, the default port, a private one)
    stack_env = {"MIGSCHED_NATS_URL": nats_url, "MIGSCHED_REDIS_URL": redis_url}
    with environ(stack_env):
        stack.start()
    try:
        yield stack
    finally:
        stack.stop(servers=False)
        asyncio.run(forget(stack))


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    import os

    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def settings_of(stack: Stack) -> Settings:
    return stack.client_settings()


async def forget(stack: Stack) -> None:
    st = settings_of(stack)
    state = RedisState.from_settings(st)
    try:
        await state.wipe()
    finally:
        await state.close()
    bus = await JetStreamBus.connect(st)
    try:
        await bus.delete_streams()
    finally:
        await bus.close()


async def exits_on_stream(bus: JetStreamBus) -> list[JobExit]:
    """Every ``JobExit`` stored on ``jobs.exit`` (an ephemeral pull consumer read to the end)."""
    sub = await bus.js.pull_subscribe(bus.subjects.jobs_exit, durable=None)
    out: list[JobExit] = []
    dec = msgspec.json.Decoder(JobExit)
    try:
        while True:
            try:
                msgs = await sub.fetch(500, timeout=1.0)
            except (TimeoutError, Exception):
                break
            if not msgs:
                break
            for m in msgs:
                out.append(dec.decode(m.data))
                await m.ack()
    finally:
        await sub.unsubscribe()
    return out
