"""After a reconnect the puller asks the server again at once: a restarted server forgot the pull requests it
had, and counting them as outstanding until they would have expired left a consumer deaf for seconds."""

from __future__ import annotations

from typing import Any

from shared.bus.puller import Puller


class FakeNats:
    def __init__(self) -> None:
        self.stats: dict[str, int] = {"reconnects": 0}
        self.published: list[tuple[str, bytes, str]] = []

    def new_inbox(self) -> str:
        return "_INBOX.test"

    async def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        self.published.append((subject, payload, reply))


async def test_pull_requests_are_renewed_after_a_reconnect_not_after_they_expire() -> None:
    nc: Any = FakeNats()
    p = Puller(nc, "JOBS", "c", batch=8, expires_s=30.0)
    await p._top_up()
    await p._top_up()
    assert len(nc.published) == 1  # one request for the batch is outstanding: no second one
    nc.stats["reconnects"] += 1
    await p._top_up()
    assert len(nc.published) == 2  # the server restarted: ask again
    await p._top_up()
    assert len(nc.published) == 2
