"""A consumer may linger briefly once a message is there, so that a burst is handled as one batch (one handler
call, one Redis round trip, one flush) instead of one message at a time; without a linger it hands over at once."""

from __future__ import annotations

import asyncio

import pytest

from shared.bus.inbox import Inbox

pytestmark = pytest.mark.unit


async def _first_batch_with_a_second_message_soon_after(linger_s: float, batch: int = 8) -> list[int]:
    inbox: Inbox[int] = Inbox(batch, linger_s)

    async def burst() -> None:
        inbox.put(1)
        await asyncio.sleep(0)  # the consumer wakes with one message buffered ...
        await asyncio.sleep(0)
        inbox.put(2)  # ... and the second arrives while it lingers

    task = asyncio.create_task(burst())
    got = await inbox.next_batch(timeout=5.0)
    await task
    return got


async def test_without_a_linger_the_first_message_is_handed_over_alone() -> None:
    assert await _first_batch_with_a_second_message_soon_after(0.0) == [1]


async def test_with_a_linger_a_message_arriving_meanwhile_joins_the_batch() -> None:
    assert await _first_batch_with_a_second_message_soon_after(0.05) == [1, 2]


async def test_a_full_batch_is_handed_over_without_lingering() -> None:
    inbox: Inbox[int] = Inbox(2, 3600.0)
    for n in (1, 2, 3):
        inbox.put(n)
    # an hour's linger would time the test out: a full batch must not wait for it
    assert await asyncio.wait_for(inbox.next_batch(timeout=5.0), timeout=5.0) == [1, 2]


async def test_nothing_within_the_timeout_is_an_empty_batch() -> None:
    assert await Inbox[int](4).next_batch(timeout=0.01) == []
