"""After a reconnect the puller asks the server again at once: a restarted server forgot the pull requests it
had, and counting them as outstanding until they would have expired left a consumer deaf for seconds."""

from __future__ import annotations

import pytest

from shared.bus.puller import PullRequests

pytestmark = pytest.mark.unit


def test_pull_requests_are_renewed_after_a_reconnect_not_after_they_expire() -> None:
    r = PullRequests(batch=8, expires_s=30.0)
    assert r.should_ask(reconnects=0, now=0.0)
    assert not r.should_ask(reconnects=0, now=1.0)  # one request for the batch is outstanding: no second one
    assert r.should_ask(reconnects=1, now=2.0)  # the server restarted: ask again
    assert not r.should_ask(reconnects=1, now=3.0)


def test_a_request_is_renewed_once_it_expires_or_its_batch_has_come() -> None:
    r = PullRequests(batch=2, expires_s=10.0)
    assert r.should_ask(0, now=0.0)
    assert not r.should_ask(0, now=8.0)
    assert r.should_ask(0, now=9.5)  # counted as over a little before the server ends it
    r.delivered()
    r.delivered()
    assert r.owed(0, now=9.6) == 0 and r.should_ask(0, now=9.6)
    r.ended()  # the server said 408: that request is over
    assert r.owed(0, now=9.7) == 0
