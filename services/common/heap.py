"""Giving freed heap memory back to the operating system.

A service that reads a whole shard every plan allocates thousands of small objects and arrays and frees them
again; glibc keeps the freed chunks in its arenas, and memory that was the top of the heap when a long-lived
object landed above it stays resident though unused. ``malloc_trim(0)`` releases the unused pages of every
arena (glibc 2.8 and later). Elsewhere (musl, macOS) there is nothing to call and this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release_free_memory() -> bool:
    """Return the heap's unused pages to the OS; False where the C library cannot."""
    trim = _malloc_trim()
    return trim is not None and trim(0) >= 0
