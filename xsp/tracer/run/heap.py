"""A steady heap in every level-set process: glibc's malloc keeps what a step frees.

With its defaults, glibc gives the top of its heap back to the system once more than its trim
threshold is free there, and takes large blocks from ``mmap`` afresh each time. A CPU step that
frees its activations at its end then page-faults them in again in the next step, or does not,
depending on what else sits at the top of the heap. Level F's own small allocations happen to
sit there, so the traced process was the faster one: the CPU demo (ResNet-18 b2 inference, 2
cores) measured M at 44 ms and MF at 32 ms; with the heap kept, M 29.4 ms and MF 33.1 ms. The
untraced baseline must not depend on the tracer's allocations, so every level-set process, M
included, keeps its freed memory (``mallopt``: no trimming, the dynamic ``mmap`` threshold
fixed at its ceiling). It changes how fast memory comes back, never a result.

A user's own ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_`` or ``glibc.malloc``
tunables win, and ``XSP_STEADY_HEAP=0`` keeps glibc's defaults. What applied is on the run's
resource as ``xsp.host.heap``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from xsp.core import config
from xsp.core.malloc import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, mallopt

__all__ = [
    "DEFAULT",
    "KEPT",
    "MMAP_THRESHOLD",
    "TRIM_THRESHOLD",
    "UNAVAILABLE",
    "USER",
    "keep_freed_memory",
]

#: Free memory kept at the heap's top: up to mallopt's largest value (an int), 2 GiB.
TRIM_THRESHOLD = 2**31 - 1
#: Blocks from this size on still come from mmap: glibc's own ceiling for its dynamic threshold
#: (32 MiB on 64-bit), which a one-off block of that size would raise it to anyway.
MMAP_THRESHOLD = 32 * 1024 * 1024

_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")

KEPT = "steady"  # freed memory kept (xsp's setting)
USER = "user"  # the user's own malloc settings
DEFAULT = "glibc default"  # XSP_STEADY_HEAP=0
UNAVAILABLE = "not glibc"  # no mallopt: another C library


def keep_freed_memory(environ: Mapping[str, str] | None = None) -> str:
    """Apply the steady heap to this process unless the user's settings say otherwise; returns
    which applied (``xsp.host.heap``)."""
    env = os.environ if environ is None else environ
    if not config.switch("XSP_STEADY_HEAP", True, env):
        return DEFAULT
    if any(name in env for name in _USER_SETTINGS) or "glibc.malloc" in env.get(
        "GLIBC_TUNABLES", ""
    ):
        return USER
    call = mallopt()
    if call is None:
        return UNAVAILABLE
    # the mmap threshold first: setting either turns glibc's dynamic adjustment off
    applied = call(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and call(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return KEPT if applied else UNAVAILABLE
