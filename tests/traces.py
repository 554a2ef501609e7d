"""Tests that read a public trace skip, with the reason and where to get it, on a machine without it."""

from __future__ import annotations

import pytest

from shared.sim.workloads.catalog import missing_hint, trace, traces_dir


def needs_trace(name: str, file: str) -> pytest.MarkDecorator:
    """Skip a test, saying why and how to get it, when a public trace file is not on this machine."""
    present = (traces_dir() / trace(name).folder / file).exists()
    return pytest.mark.skipif(not present, reason=f"{file} is absent: {missing_hint(name)}")
