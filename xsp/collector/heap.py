"""Request bodies go back to the system once handled.

glibc's malloc takes a block from ``mmap`` only above a threshold that rises, up to 32 MiB, to
the size of each such block freed. After the first large request, bodies just under the request
limit (32 MiB by default) came from the receiving threads' heaps, which keep what they free: 100
concurrent 31 MiB gRPC requests left the receivers' process at 1.3 GB after they were answered.
A fixed threshold keeps every body in its own mapping, unmapped when freed.
"""

from __future__ import annotations

import os

from xsp.core.malloc import M_MMAP_THRESHOLD, mallopt

__all__ = ["MMAP_THRESHOLD", "return_large_blocks"]

#: Blocks from 1 MiB on come from mmap, whatever was freed before.
MMAP_THRESHOLD = 1024 * 1024


def return_large_blocks() -> bool:
    """Fix glibc's mmap threshold for this process (a user's ``MALLOC_MMAP_THRESHOLD_`` wins);
    False where it does not apply (not glibc)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    call = mallopt()
    return call is not None and bool(call(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
