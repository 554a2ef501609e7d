"""A job's fields read from its hash: its history from the numbered fields (and an older version's list), and
the quota charge stored with it."""

from __future__ import annotations

import pytest

from shared.state.codec import HISTORY_MAX, decode_charge, history_raw

pytestmark = pytest.mark.unit


def test_entries_come_in_the_order_of_their_numbers_not_of_the_fields() -> None:
    job = {b"state": b"running", b"h10": b"ten", b"hn": b"10", b"h9": b"nine", b"h2": b"two", b"hx": b"not one"}
    assert history_raw(job) == [b"two", b"nine", b"ten"]


def test_an_older_versions_list_comes_first_and_only_the_last_entries_are_kept() -> None:
    job = {f"h{n}": f"new{n}" for n in range(1, HISTORY_MAX + 1)}
    got = history_raw(job, ["old1", "old2"])
    assert len(got) == HISTORY_MAX and got[0] == "new1" and got[-1] == f"new{HISTORY_MAX}"
    assert history_raw({"h1": "new1"}, ["old1", "old2"]) == ["old1", "old2", "new1"]


def test_a_job_without_history_has_none() -> None:
    assert history_raw(None) == [] and history_raw({b"state": b"pending"}, []) == []


def test_a_jobs_stored_charge_keeps_only_its_numbers_and_reads_as_none_when_unreadable() -> None:
    assert decode_charge(b'{"compute_slices": 3, "memory_gib": 20.5}') == {"compute_slices": 3.0, "memory_gib": 20.5}
    assert decode_charge(b'{"compute_slices": "3", "memory_gib": null, "x": true, "gpu": 1}') == {"gpu": 1.0}
    assert decode_charge(b"not json") == {} and decode_charge(b"[1, 2]") == {} and decode_charge(None) == {}
