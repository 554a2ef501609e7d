"""Redis commands packed by hiredis (shared/state/fastpack.py): the same bytes as redis-py's own packing, the
same refusal of what redis-py refuses, and the class ``from_url`` would pick (TLS, unix socket) kept."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import DataError

from services.common.testing import make_settings
from shared.state import RedisState
from shared.state.fastpack import HiredisConnection, HiredisSSLConnection, HiredisUnixConnection, connection_class

pytestmark = pytest.mark.unit

COMMANDS: list[tuple[Any, ...]] = [
    ("EVALSHA", "0" * 40, 2, "{ns:0}:gpus", b"{ns:0}:job:j1", "j1", "completed", 1000.123456789, -3, 0.1, 1e20),
    ("SCRIPT LOAD", "return 1"),
    (b"CONFIG GET", b"maxmemory"),
    ("HSET", "k", "f", "ünïcode", b"\x00\xff", memoryview(b"view"), 12345678901234567890, float("inf")),
    ("SET", "big", b"x" * 100_000),
]


def _bytes(chunks: list[Any]) -> bytes:
    return b"".join(bytes(c) for c in chunks)


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: str(a[0]))
def test_hiredis_packs_the_same_bytes_as_redis_py(args: tuple[Any, ...]) -> None:
    assert _bytes(HiredisConnection().pack_command(*args)) == _bytes(Connection().pack_command(*args))


def test_a_pipeline_packs_the_same_bytes() -> None:
    assert _bytes(HiredisConnection().pack_commands(COMMANDS)) == _bytes(Connection().pack_commands(COMMANDS))


@pytest.mark.parametrize("bad", [True, None, [1]])
def test_what_redis_py_refuses_is_refused_alike(bad: Any) -> None:
    with pytest.raises(DataError):
        HiredisConnection().pack_command("SET", "k", bad)


def test_the_store_connects_with_the_class_from_url_would_pick_packing_with_hiredis() -> None:
    assert connection_class("redis://h:6379/0") is HiredisConnection
    assert issubclass(connection_class("rediss://h:6379/0"), SSLConnection)
    assert connection_class("rediss://h:6379/0") is HiredisSSLConnection
    assert issubclass(connection_class("unix:///tmp/r.sock"), UnixDomainSocketConnection)
    assert connection_class("unix:///tmp/r.sock") is HiredisUnixConnection
    state = RedisState.from_settings(make_settings("fp", "nats://127.0.0.1:1", "redis://127.0.0.1:1/0"))
    assert state.redis.connection_pool.connection_class is HiredisConnection
