"""``RoundTrips`` against a real Redis: replies in order with error replies in place, a broken connection failing
one round trip (retried only as far as the client's ``Retry`` allows), a cancelled round trip never answering the
next one, and the connections given back on close; and the store's connections writing without
``asyncio.wait_for`` while keeping redis-py's write errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from shared.state.fastpack import connection_class
from shared.state.roundtrip import RoundTrips

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


@dataclass
class Rig:
    r: aioredis.Redis
    trips: RoundTrips
    key: str


async def rig_for(redis_url: str, prefix: str, **client_options: Any) -> AsyncIterator[Rig]:
    r = aioredis.from_url(
        redis_url, decode_responses=False, connection_class=connection_class(redis_url), **client_options
    )
    rig = Rig(r, RoundTrips(r), f"{prefix}:rt")
    try:
        yield rig
    finally:
        keys = [k async for k in r.scan_iter(match=f"{rig.key}*")]
        if keys:
            await r.delete(*keys)
        await rig.trips.close()
        await r.aclose()


@pytest.fixture
async def rig(redis_url: str, prefix: str) -> AsyncIterator[Rig]:
    """The store's client: ``from_url`` without a ``Retry``."""
    async for made in rig_for(redis_url, prefix):
        yield made


@pytest.fixture
async def retrying(redis_url: str, prefix: str) -> AsyncIterator[Rig]:
    async for made in rig_for(redis_url, prefix, retry=Retry(NoBackoff(), 1)):
        yield made


async def test_replies_come_back_in_command_order_with_each_error_reply_in_its_commands_place(rig: Rig) -> None:
    key = rig.key
    out = await rig.trips.run(
        [
            ("SET", key, "v1"),
            ("EVALSHA", "0" * 40, 0),  # no such script
            ("INCR", key),  # not an integer
            ("GET", key),
            ("HSET", f"{key}:h", "f", "x"),
        ]
    )
    assert out[0] is True or out[0] == b"OK"
    assert isinstance(out[1], NoScriptError)
    assert isinstance(out[2], ResponseError) and not isinstance(out[2], NoScriptError)
    assert out[3:] == [b"v1", 1]
    assert await rig.trips.run([("GET", key)]) == [b"v1"]  # the connection is still in step


async def test_a_connection_killed_between_round_trips_fails_the_next_one_and_the_one_after_reconnects(
    rig: Rig,
) -> None:
    # no Retry on the store's client: the trip fails, as redis-py's pipeline did for it
    await rig.trips.run([("SET", rig.key, "1")])
    (my_id,) = await rig.trips.run([("CLIENT", "ID")])
    assert await rig.r.client_kill_filter(_id=my_id) == 1
    with pytest.raises(RedisConnectionError):
        await rig.trips.run([("INCR", rig.key)])
    assert await rig.trips.run([("INCR", rig.key), ("GET", rig.key)]) == [2, b"2"]
    (new_id,) = await rig.trips.run([("CLIENT", "ID")])
    assert new_id != my_id


async def test_with_a_client_retry_a_batch_cut_off_by_a_killed_connection_is_sent_again_on_a_new_one(
    retrying: Rig,
) -> None:
    trips, key = retrying.trips, retrying.key
    (my_id,) = await trips.run([("CLIENT", "ID")])
    assert await retrying.r.client_kill_filter(_id=my_id) == 1
    assert await trips.run([("SET", key, "2"), ("GET", key)]) in ([True, b"2"], [b"OK", b"2"])
    (new_id,) = await trips.run([("CLIENT", "ID")])
    assert new_id != my_id


async def test_a_round_trip_cancelled_before_its_replies_leaves_no_reply_for_the_next_one(rig: Rig) -> None:
    key = rig.key
    await rig.r.set(key, "after")
    # BLPOP on an empty list holds the reply back until its own time-out, after the cancellation
    slow = asyncio.ensure_future(rig.trips.run([("BLPOP", f"{key}:empty", 0.5), ("SET", f"{key}:x", "1")]))
    await asyncio.sleep(0.1)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    assert await rig.trips.run([("GET", key)]) == [b"after"]
    await asyncio.sleep(0.6)  # the held-back replies are now due: they must not reach this trip either
    assert await rig.trips.run([("GET", key), ("EXISTS", f"{key}:nothing")]) == [b"after", 0]


async def test_concurrent_round_trips_each_get_their_own_replies_and_close_gives_every_connection_back(
    rig: Rig,
) -> None:
    keys = [f"{rig.key}{i}" for i in range(8)]
    await rig.r.mset({k: str(i) for i, k in enumerate(keys)})
    outs = await asyncio.gather(*(rig.trips.run([("GET", k), ("STRLEN", k)]) for k in keys))
    assert outs == [[str(i).encode(), 1] for i in range(len(keys))]
    pool = rig.r.connection_pool
    held = len(rig.trips._held)
    assert held >= 1
    in_use_before = len(pool._in_use_connections)
    await rig.trips.close()
    assert len(pool._in_use_connections) == in_use_before - held
    assert await rig.trips.run([("GET", keys[0])]) == [b"0"]  # usable again after close: checks one out anew


async def test_a_connected_connection_writes_without_asyncio_wait_for_and_keeps_redis_pys_write_errors(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis.asyncio.connection as redis_connection

    await rig.r.ping()  # connected: writes take the scoped path from now on

    def no_wait_for(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("asyncio.wait_for used for a write (a Task per command)")

    monkeypatch.setattr(redis_connection.asyncio, "wait_for", no_wait_for)
    assert await rig.r.set(rig.key, "1") is True
    assert await rig.trips.run([("GET", rig.key)]) == [b"1"]

    conn = await rig.r.connection_pool.get_connection()
    try:
        def broken(_data: Any) -> None:
            raise BrokenPipeError(32, "Broken pipe")

        monkeypatch.setattr(conn._writer, "writelines", broken)
        with pytest.raises(RedisConnectionError, match="Error while writing to socket"):
            await conn.send_packed_command(conn.pack_command("GET", rig.key))
        assert not conn.is_connected  # closed, as redis-py closes a connection whose write failed
    finally:
        await rig.r.connection_pool.release(conn)
