"""Which nats-server versions a replicated deployment is warned about at start."""

from __future__ import annotations

import pytest

from shared.bus.server_version import parse, replication_warning

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("version", ["2.9.10", "2.10.25", "2.10.26", "v2.10.29"])
def test_a_server_before_2_11_with_replicated_streams_is_warned_about(version: str) -> None:
    why = replication_warning(version, replicas=3)
    assert why is not None
    assert version in why and "2.11" in why and "MIGSCHED_STREAM_REPLICAS=3" in why


@pytest.mark.parametrize("version", ["2.11.0", "2.11.4", "2.12.1", "3.0.0"])
def test_a_server_from_2_11_on_is_not_warned_about(version: str) -> None:
    assert replication_warning(version, replicas=3) is None


def test_streams_of_one_copy_are_never_warned_about_whatever_the_server() -> None:
    assert replication_warning("2.9.10", replicas=1) is None
    assert replication_warning("garbage", replicas=1) is None


def test_a_version_that_is_not_one_is_said_to_be_unknown() -> None:
    why = replication_warning("<nats server vnightly>", replicas=3)
    assert why is not None and "unknown" in why


def test_a_version_string_parses_to_its_three_numbers() -> None:
    assert parse("2.9.10") == (2, 9, 10)
    assert parse("v2.11.0-RC.1") == (2, 11, 0)
    assert parse("2.11") is None
