"""Untraced iterations between the traced ones, in the process that prices the tracer.

XSP's method assumes that every level-set process runs the workload at the same speed. On the
lent H100 and H200 hosts a host-bound step moved by up to ±25% between processes with nothing
changed, so a replay checked only against M's process checks the host's speed as much as the
replay. The process that prices F's cost (the shallowest level set with F) therefore measures
in pairs: before each traced iteration it runs one untraced iteration, the levels below M
switched off between the two (their sampling switch, about 26 µs each way on the H200, outside
both timed steps). Both are timed the way level M times its step: a device sync, the clock, the
iteration, a device sync, the clock. Each traced iteration then has untraced neighbours at the
same host speed, and ``xsp.analysis.replay`` fits F's cost on some pairs and checks the replay
on the others.

Only levels that switch off cheaply can take part: F, and on the CPU oneDNN's L. CUPTI's levels
(L and G on CUDA) cannot: attached with its kinds off CUPTI still costs every CUDA call, and a
start and finalize costs about 11 ms (``unavailable`` says why, into ``run.json``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from xsp.core.levelset import LevelSet
from xsp.core.run_sections import InterleaveEntry, InterleaveReport

__all__ = ["RUN_KEY", "Interleave", "run_entry", "unavailable"]

#: How ``run.json`` names the record of the pairs.
RUN_KEY = "interleaved"


def unavailable(levels: LevelSet, device: str, continuous: bool) -> str | None:
    """Why ``levels`` cannot interleave untraced iterations on ``device``; None when it can."""
    if continuous:
        return "a continuous session samples its iterations instead"
    if not levels.framework:
        return f"level set {levels} has no level F to switch off"
    if levels.counters:
        return f"level set {levels} replays kernels under Nsight Compute"
    if levels.gpu:
        return (
            f"level set {levels} records G, which cannot be switched off between iterations "
            "(CUPTI's start and finalize cost about 11 ms)"
        )
    if levels.library and device.startswith("cuda"):
        return (
            f"level set {levels} records L through CUPTI, which costs every CUDA call while "
            "attached"
        )
    return None


class Interleave:
    """The timed pairs: ``untraced_ms[i]`` is the untraced iteration run just before traced
    iteration ``i``, ``traced_ms[i]`` that traced iteration, both timed alike. Called from the
    session's markers on the program's thread; never raises past them."""

    def __init__(self, device: str) -> None:
        self._sync: Callable[[], Any] | None = None
        if device.startswith("cuda"):
            import torch

            self._sync = torch.cuda.synchronize
        self._began = 0
        self._switched_ns: list[int] = []
        self.untraced_ms: list[float | None] = []
        self.traced_ms: list[float | None] = []

    def _now(self) -> int:
        if self._sync is not None:
            self._sync()
        return time.perf_counter_ns()

    def begin(self) -> None:
        self._began = self._now()

    def _took_ms(self) -> float:
        return round((self._now() - self._began) / 1e6, 4)

    def end_untraced(self, failed: bool) -> None:
        """The untraced iteration is over (``failed``: it raised; its time is not kept)."""
        took = self._took_ms()
        self.untraced_ms.append(None if failed else took)

    def end_traced(self, index: int, failed: bool) -> None:
        """Traced iteration ``index`` is over."""
        took = self._took_ms()
        while len(self.traced_ms) < index:  # a traced iteration without its untraced one
            self.traced_ms.append(None)
        self.traced_ms.append(None if failed else took)
        while len(self.untraced_ms) < len(self.traced_ms):
            self.untraced_ms.append(None)

    def switched(self, began_ns: int) -> None:
        """A switch of the levels, off or on, that began at ``began_ns`` (perf_counter)."""
        self._switched_ns.append(time.perf_counter_ns() - began_ns)

    def report(self) -> InterleaveReport:
        """``run.json``'s record of the pairs."""
        pairs = sum(
            1
            for u, t in zip(self.untraced_ms, self.traced_ms, strict=False)
            if u is not None and t is not None
        )
        switched = sorted(self._switched_ns)
        return {
            "untraced_ms": list(self.untraced_ms),
            "traced_ms": list(self.traced_ms),
            "pairs": pairs,
            "switch_us": round(switched[len(switched) // 2] / 1e3, 1) if switched else None,
        }


def run_entry(active: Interleave | None, skipped: str | None) -> InterleaveEntry:
    """run.json's entry: the interleaved iterations' report, or why there were none."""
    if active is not None:
        return {"interleaved": active.report()}  # RUN_KEY
    if skipped is not None:
        return {"interleaved": {"skipped": skipped}}  # RUN_KEY
    return {}
