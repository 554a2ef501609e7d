"""A dead letter's reason becomes one label of a closed set, whatever the decoder or the loop wrote."""

from __future__ import annotations

import json

import pytest

from shared.bus.dead_letters import reason_class
from shared.events import DecodeError, decode

pytestmark = pytest.mark.unit


def reason_of(subject: str, data: bytes) -> str:
    with pytest.raises(DecodeError) as e:
        decode(subject, data)
    return e.value.reason


@pytest.mark.parametrize(("subject", "data", "label"), [
    ("jobs.submit", b"{not json", "malformed"),
    ("jobs.submit", b"x" * 300_000, "too_large"),
    ("jobs.submit", json.dumps({"v": 1, "id": "a", "job_id": "a", "submitted_at": 1.0}).encode(), "invalid"),
    ("jobs.submit", json.dumps({"v": 1, "id": "a", "job_id": "a", "submitted_at": 1.0,
                                "demand": {"profile": "9g.99gb"}}).encode(), "invalid"),
    ("node.n1.heartbeat", json.dumps({"v": 1, "id": "h", "node": "n2", "seq": 1, "at": 1.0}).encode(), "wrong_node"),
])
def test_a_decoder_refusal_is_labelled_by_its_kind(subject: str, data: bytes, label: str) -> None:
    assert reason_class(reason_of(subject, data)) == label


def test_the_loops_own_reasons_are_labelled_and_anything_else_is_the_handlers() -> None:
    assert reason_class("exceeded 5 deliveries") == "max_deliveries"
    assert reason_class("undecodable: ValueError('invalid literal')") == "undecodable"
    assert reason_class("the workload's argv names no program") == "handler"
