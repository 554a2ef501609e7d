"""Fixtures shared by the end-to-end modules that run the stack as processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fault_harness import Servers, private_servers


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """A private NATS and Redis for the module (its stack's file-backed streams and state go with them)."""
    s = private_servers(tmp_path_factory.mktemp("servers"))
    yield s
    s.stop()
