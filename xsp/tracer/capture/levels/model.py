"""Level M: one root span per iteration, bounded by device synchronization.

The iteration's start and end are read by the native core (CLOCK_REALTIME, the clock of the
native op records, with CUPTI's shifted onto it) right after the device has drained, so the
span's duration is the true step latency, with no queued GPU work spilling into the next
iteration. Each finished iteration goes into the capture arena at once, so it survives a program
that dies later.

An iteration that begins inside a recording OpenTelemetry span of the application joins that
span's trace (``xsp.tracer.capture.hooks.context``): the span is read once, before the clock starts,
and kept here beside the arena (a dead process's recovered run keeps xsp's own ids).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from xsp.core.arena import ArenaContents, step_records
from xsp.core.records import StepRecords
from xsp.core.run_sections import RunCounts
from xsp.tracer.capture.hooks.arena import CaptureArena
from xsp.tracer.capture.hooks.context import OTEL_TRACE, SpanRef, application_span

if TYPE_CHECKING:
    from xsp.tracer.capture.levels import LevelContext
    from xsp.tracer.export.batches import BatchDrain

__all__ = ["ModelLevel", "build"]


class ModelLevel:
    letter = "M"

    def __init__(self, device: str, arena: CaptureArena) -> None:
        self._device = device
        self._sync = _synchronizer(device)
        self._arena = arena
        self._app_parents: dict[int, SpanRef] = {}
        # a service's every request passes here: one native call per boundary, which reads the
        # clock (and, at the end, writes the step record) itself
        native = arena.native
        self._step_begin, self._step_end = native.step_begin, native.step_end
        self._modules = sys.modules

    def enable(self) -> None:
        self._arena.open()
        self._sync = _synchronizer(self._device)  # the warm-up has initialized CUDA by now

    def begin_iteration(self, index: int) -> None:
        if OTEL_TRACE in self._modules:  # the API is read only where the program uses it
            parent = application_span()
            if parent is not None:
                self._app_parents[index] = parent
        if self._sync is not None:
            self._sync()
        self._step_begin(index)

    def end_iteration(self, index: int) -> None:
        if self._sync is not None:
            self._sync()
        self._step_end()

    def disable(self) -> None:
        pass

    @property
    def sync(self) -> Any:
        """The device's synchronize, or None (the CPU)."""
        return self._sync

    def handover(self) -> BatchDrain:
        """A continuous session's batch boundary (``FrameworkLevel.handover``): the drain of this
        batch's iterations, run later on the exporter's thread, with their application spans."""
        parents, self._app_parents = self._app_parents, {}

        def drain(contents: ArenaContents) -> tuple[StepRecords, RunCounts]:
            records = step_records(contents)
            records.app_parents = parents
            return records, {"arena": contents.counts.copy()}

        return drain

    def drain(self) -> StepRecords:
        records, _ = self.handover()(self._arena.contents())
        return records

    def counts(self) -> RunCounts:
        """What the arena could not hold (merged into run.json)."""
        return {"arena": self._arena.contents().counts.copy()}


def _synchronizer(device: str):  # type: ignore[no-untyped-def]
    """The current device's synchronize, called twice a request in a service: torch's own
    binding where it has one, without ``torch.cuda.synchronize``'s device switch (a context
    manager built and entered each call, for a device that is already current)."""
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_initialized():  # else torch's wrapper initializes it first
            return getattr(torch._C, "_cuda_synchronize", torch.cuda.synchronize)
        return torch.cuda.synchronize
    return None  # the CPU's work is done when the call returns


def build(ctx: LevelContext) -> ModelLevel:
    """Level M of a session (its row in ``xsp.core.levels`` names this factory)."""
    return ModelLevel(ctx.device, ctx.arena)
