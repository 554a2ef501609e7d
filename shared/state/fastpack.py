"""Redis connections that pack commands with hiredis.

redis-py 8's asyncio client packs every command in Python (``Connection.pack_command`` and its encoder) even
with hiredis installed, which was 15 % of the partitioner's and 10 % of the balancer's CPU at 1,000 jobs/s;
``hiredis.pack_command`` writes the same bytes about 9 times faster (an 11-argument ``EVALSHA``: 0.8 µs
against 7.3 µs). Pipelines pack through ``pack_command`` too (``pack_commands``), so they get it as well.

The bytes are identical for what redis-py accepts (str as UTF-8, bytes, memoryview, int, float as ``repr``);
anything hiredis refuses (bool, None, other types) falls back to redis-py's own packing, which raises its usual
``DataError``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import hiredis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
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


class HiredisConnection(Connection):
    def pack_command(self, *args: EncodableT) -> list[bytes]:
        return _hiredis_pack(self, args) or super().pack_command(*args)


class HiredisSSLConnection(SSLConnection):
    def pack_command(self, *args: EncodableT) -> list[bytes]:
        return _hiredis_pack(self, args) or super().pack_command(*args)


class HiredisUnixConnection(UnixDomainSocketConnection):
    def pack_command(self, *args: EncodableT) -> list[bytes]:
        return _hiredis_pack(self, args) or super().pack_command(*args)


def connection_class(url: str) -> type[Connection] | type[UnixDomainSocketConnection]:
    """The connection class ``redis.asyncio.from_url`` would pick for ``url``, packing with hiredis."""
    scheme = urlparse(url).scheme
    if scheme == "rediss":
        return HiredisSSLConnection
    if scheme == "unix":
        return HiredisUnixConnection
    return HiredisConnection
