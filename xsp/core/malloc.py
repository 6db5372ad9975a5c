"""glibc's ``mallopt``, found once for the heaps that tune it (a level-set process's steady heap,
the collector's request bodies)."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache

__all__ = ["M_MMAP_THRESHOLD", "M_TRIM_THRESHOLD", "mallopt"]

#: mallopt's parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


@cache
def mallopt() -> Callable[[int, int], int] | None:
    """This process's ``mallopt(param, value)``; None where the C library has none (not glibc)."""
    libc = ctypes.util.find_library("c")
    try:
        found = ctypes.CDLL(libc).mallopt if libc else None
    except (OSError, AttributeError):
        return None
    if found is not None:
        found.argtypes = (ctypes.c_int, ctypes.c_int)
    return found
