"""CUDA graph captures turn a session's levels on.

A kernel replayed from a CUDA graph is attributed through the node it replays, to the op that
made that node while the graph was captured (``xsp.tracer.convert.graphs``), and the native
core sees those nodes only while levels F and G are on. Programs capture in their warm-up or
before their loop (``torch.cuda.make_graphed_callables``, torch.compile's CUDA graph trees, a
static decode step), before levels normally come on (one warm-up iteration early). So a capture
that begins while a session with level G has its levels off turns them on first: the rest of the
warm-up runs traced, and still unmeasured.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["turn_levels_on_at_capture"]

log = logging.getLogger(__name__)

_hooked = False


def turn_levels_on_at_capture(on_capture: Callable[[], None]) -> None:
    """Call ``on_capture`` before every ``torch.cuda.CUDAGraph.capture_begin`` (once per
    process; ``on_capture`` finds the current session itself)."""
    global _hooked
    if _hooked:
        return
    try:
        from torch.cuda import graphs
    except ImportError:  # a torch without CUDA graphs: nothing to capture
        return
    original = graphs.CUDAGraph.capture_begin

    @functools.wraps(original)
    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            on_capture()
        except Exception:  # the program's capture goes ahead whatever happened here
            log.exception("xsp: turning levels on at a CUDA graph capture failed")
        return original(self, *args, **kwargs)

    graphs.CUDAGraph.capture_begin = capture_begin  # type: ignore[method-assign]
    _hooked = True
