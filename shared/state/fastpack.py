"""Redis connections that pack commands with hiredis.

redis-py 8's asyncio client packs every command in Python (``Connection.pack_command`` and its encoder) even
with hiredis installed, which was 15 % of the node registry's and 10 % of the balancer's CPU at 1,000 jobs/s;
``hiredis.pack_command`` writes the same bytes about 9 times faster (an 11-argument ``EVALSHA``: 0.8 µs
against 7.3 µs). Pipelines pack through ``pack_command`` too (``pack_commands``), so they get it as well.

The bytes are identical for what redis-py accepts (str as UTF-8, bytes, memoryview, int, float as ``repr``);
anything hiredis refuses (bool, None, other types) falls back to redis-py's own packing, which raises its usual
``DataError``.

They also write without a Task per command: with a socket timeout (redis-py's default is 5 s) redis-py sends
through ``asyncio.wait_for``, which on Python 3.11 wraps every write in a new Task, ~25 µs of a pipelined round
trip's ~140 µs; a timeout scope gives the same deadline and errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlparse

import hiredis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

_pack = hiredis.pack_command


def _hiredis_pack(conn: Any, args: tuple[Any, ...]) -> list[bytes] | None:
    """The packed command, or None when redis-py must do it (an argument hiredis refuses, another encoding)."""
    if conn.encoder.encoding.lower().replace("-", "") != "utf8" or conn.encoder.encoding_errors != "strict":
        return None
    first = args[0]
    # as redis-py does: literal words in the command name ('SCRIPT LOAD') are sent as separate arguments
    if isinstance(first, str):
        if " " in first:
            args = (*first.split(), *args[1:])
    elif isinstance(first, bytes) and b" " in first:
        args = (*first.split(), *args[1:])
    try:
        return [_pack(args)]
    except TypeError:
        return None


async def _send_scoped(conn: Any, command: bytes | str | Iterable[bytes], check_health: bool) -> None:
    """redis-py's ``send_packed_command`` on a connected connection, its deadline a timeout scope."""
    if check_health:
        await conn.check_health()
    if isinstance(command, str):
        command = command.encode()
    if isinstance(command, bytes):
        command = [command]
    try:
        async with asyncio.timeout(conn.socket_timeout):
            conn._writer.writelines(command)
            await conn._writer.drain()
    except TimeoutError:  # before OSError: the builtin TimeoutError is one
        await conn.disconnect(nowait=True)
        raise RedisTimeoutError("Timeout writing to socket") from None
    except OSError as e:
        await conn.disconnect(nowait=True)
        raise RedisConnectionError(f"Error while writing to socket: {e}") from e
    except BaseException:
        # a write cut short leaves the stream out of step: as redis-py does, the connection is closed
        await conn.disconnect(nowait=True)
        raise


class _FastSend:
    """``pack_command`` through hiredis; ``send_packed_command`` without ``asyncio.wait_for`` once connected
    (connecting, and a connection without a socket timeout, take redis-py's own path)."""

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        return _hiredis_pack(self, args) or super().pack_command(*args)  # type: ignore[misc]

    async def send_packed_command(self, command: bytes | str | Iterable[bytes], check_health: bool = True) -> None:
        if not self.socket_timeout or not self.is_connected:  # type: ignore[attr-defined]
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
            return
        await _send_scoped(self, command, check_health)


class HiredisConnection(_FastSend, Connection):
    pass


class HiredisSSLConnection(_FastSend, SSLConnection):
    pass


class HiredisUnixConnection(_FastSend, UnixDomainSocketConnection):
    pass


def connection_class(url: str) -> type[Connection] | type[UnixDomainSocketConnection]:
    """The connection class ``redis.asyncio.from_url`` would pick for ``url``, packing with hiredis."""
    scheme = urlparse(url).scheme
    if scheme == "rediss":
        return HiredisSSLConnection
    if scheme == "unix":
        return HiredisUnixConnection
    return HiredisConnection
