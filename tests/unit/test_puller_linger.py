"""A consumer may linger briefly once a message is there, so that a burst is handled as one batch (one handler
call, one Redis round trip, one flush) instead of one message at a time; without a linger it hands over at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_puller_reconnect import FakeNats

from shared.bus.puller import Puller

pytestmark = pytest.mark.unit


class FakeMsg:
    def __init__(self, n: int) -> None:
        self.n = n
        self.headers: dict[str, str] | None = None
        self.data = b"x"


async def _first_batch_with_a_second_message_soon_after(linger_s: float, batch: int = 8) -> list[int]:
    p = Puller(FakeNats(), "JOBS", "c", batch=batch, linger_s=linger_s)  # type: ignore[arg-type]

    async def burst() -> None:
        await p._on_msg(FakeMsg(1))  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the consumer wakes with one message buffered ...
        await asyncio.sleep(0)
        await p._on_msg(FakeMsg(2))  # type: ignore[arg-type]  ... and the second arrives while it lingers

    task = asyncio.create_task(burst())
    got: list[Any] = await p.next_batch(timeout=5.0)
    await task
    return [m.n for m in got]


async def test_without_a_linger_the_first_message_is_handed_over_alone() -> None:
    assert await _first_batch_with_a_second_message_soon_after(0.0) == [1]


async def test_with_a_linger_a_message_arriving_meanwhile_joins_the_batch() -> None:
    assert await _first_batch_with_a_second_message_soon_after(0.05) == [1, 2]


async def test_a_full_batch_is_handed_over_without_lingering() -> None:
    p = Puller(FakeNats(), "JOBS", "c", batch=2, linger_s=3600.0)  # type: ignore[arg-type]
    for n in (1, 2, 3):
        await p._on_msg(FakeMsg(n))  # type: ignore[arg-type]
    # an hour's linger would time the test out: a full batch must not wait for it
    got = await asyncio.wait_for(p.next_batch(timeout=5.0), timeout=5.0)
    assert [m.n for m in got] == [1, 2]
