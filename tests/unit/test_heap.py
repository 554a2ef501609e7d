"""Handing the heap's unused pages back to the OS: done with glibc, a no-op elsewhere."""

from __future__ import annotations

import ctypes.util
import platform

import pytest

from services.common import heap

pytestmark = pytest.mark.unit


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_memory_is_handed_back_where_glibc_can() -> None:
    heap._malloc_trim.cache_clear()
    assert heap.release_free_memory() is True


def test_without_a_c_library_to_ask_nothing_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    heap._malloc_trim.cache_clear()
    try:
        assert heap.release_free_memory() is False
    finally:
        heap._malloc_trim.cache_clear()
