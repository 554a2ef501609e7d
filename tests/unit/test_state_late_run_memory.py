"""The registry reads a place command's attempt back from its id (the late-run scenarios run on both stores in
``tests/contract/``)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_the_registry_reads_the_attempt_back_from_the_place_command_id() -> None:
    from services.common.place_command import place_cmd_id
    from services.registry.reports import place_attempt

    assert place_attempt(place_cmd_id("j:1", 3), "j:1") == 3
    assert place_attempt(place_cmd_id("j1", 0), "j2") is None  # another job's command
    assert place_attempt("stop:j1", "j1") is None
    assert place_attempt("mig:j1:7:start", "j1") is None
