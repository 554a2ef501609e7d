"""``RoundTrips``: a batch of Redis commands sent as one write and answered in one pass, on connections this
store keeps checked out of the client's pool.

The store's transitions go to Redis as one pipeline per fetched batch (``shared.state.batch``). redis-py's
``Pipeline`` object spends ~80 µs of client CPU per round trip on its own machinery (a pool check-out and
check-in, a retry wrapper, a timeout per reply, response callbacks, observability hooks) against ~45 µs for the
write, the wake-up and the reads themselves. This keeps what matters of it:
commands are packed by the connection (``shared.state.fastpack``), replies read by its parser, an error reply
is returned in its command's place (``raise_on_error=False``), a connection error or time-out closes the
connection (its replies would be out of step) and the batch is sent again under the client's ``Retry``, as
redis-py's pipeline does: the transitions are idempotent, so a batch that ran before its connection broke is
harmless to run again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError


class RoundTrips:
    def __init__(self, redis: Redis) -> None:
        self._pool = redis.connection_pool
        self._idle: list[Any] = []  # connections checked out of the pool, between two round trips
        self._held: list[Any] = []  # every connection checked out (returned to the pool by ``close``)

    async def _connection(self) -> Any:
        if self._idle:
            return self._idle.pop()
        conn = await self._pool.get_connection()
        self._held.append(conn)
        return conn

    async def run(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """One write, one reply per command in order; an error reply is returned as its exception."""
        if not commands:
            return []
        conn = await self._connection()
        try:
            out: list[Any] = await conn.retry.call_with_retry(
                lambda: self._once(conn, commands), lambda _error: conn.disconnect()
            )
        except BaseException:
            # cancelled, or out of retries: whatever is unread must not answer the next batch
            await conn.disconnect(nowait=True)
            self._idle.append(conn)
            raise
        self._idle.append(conn)
        return out

    @staticmethod
    async def _once(conn: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
        await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        out: list[Any] = []
        for _ in commands:
            try:
                out.append(await conn.read_response())
            except ResponseError as exc:  # the connection stays in step: the error was the whole reply
                out.append(exc)
        return out

    async def close(self) -> None:
        """Give the connections back to the pool (which the client's ``aclose`` then disconnects)."""
        held, self._held, self._idle = self._held, [], []
        for conn in held:
            await self._pool.release(conn)
