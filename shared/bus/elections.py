"""Leader elections of durable consumers, counted from JetStream's advisories.

An older nats-server (2.9.10 among them) names a clustered consumer's leader without saying since when (its
consumer info has no ``leader_since``), so a leader that moves away and back between two looks reads as one that
never moved; such servers are also the ones that can skip a message across a move
(``shared.bus.server_version``). Every election is
also announced on ``$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.<stream>.<consumer>``: counting those, from the
first look at a consumer on, tells the looks apart. An election while the client is disconnected is missed; the
leader's name still tells one that did not come back.
"""

from __future__ import annotations

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared.bus.errors import BusError


def advisory_subject(stream: str, durable: str) -> str:
    return f"$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.{stream}.{durable}"


class Elections:
    """Per (stream, durable consumer) asked about, the elections announced since it was first asked about."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self._counts: dict[tuple[str, str], list[int]] = {}

    async def count(self, stream: str, durable: str) -> int:
        key = (stream, durable)
        box = self._counts.get(key)
        if box is None:
            box = [0]

            async def elected(_: Msg) -> None:
                box[0] += 1

            try:
                await self.nc.subscribe(advisory_subject(stream, durable), cb=elected)
            except nats.errors.Error as exc:
                raise BusError(f"cannot watch the leader elections of {durable} on {stream}: {exc!r}") from exc
            self._counts[key] = box
        return box[0]
