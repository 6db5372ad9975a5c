"""Level M: one root span per iteration, bounded by device synchronization.

The iteration's start and end are read with ``time.time_ns()`` (CLOCK_REALTIME, the clock of the
native op records, with CUPTI's shifted onto it) right after the device has drained, so the
span's duration is the true step latency, with no queued GPU work spilling into the next
iteration. Each finished iteration goes into the capture arena at once, so it survives a program
that dies later.

An iteration that begins inside a recording OpenTelemetry span of the application joins that
span's trace (``xsp.tracer.capture.context``): the span is read once, before the clock starts,
and kept here beside the arena (a dead process's recovered run keeps xsp's own ids).
"""

from __future__ import annotations

import time
from typing import Any

from xsp.tracer.capture.arena import CaptureArena
from xsp.tracer.capture.context import SpanRef, application_span
from xsp.tracer.convert.arena import step_records
from xsp.tracer.convert.records import StepRecords


class ModelLevel:
    letter = "M"

    def __init__(self, device: str, arena: CaptureArena) -> None:
        self._sync = _synchronizer(device)
        self._arena = arena
        self._open: tuple[int, int] | None = None
        self._app_parents: dict[int, SpanRef] = {}

    def enable(self) -> None:
        self._arena.open()

    def begin_iteration(self, index: int) -> None:
        parent = application_span()
        if parent is not None:
            self._app_parents[index] = parent
        self._sync()
        self._open = (index, time.time_ns())

    def end_iteration(self, index: int) -> None:
        self._sync()
        end = time.time_ns()
        if self._open is None:
            return
        start_index, start = self._open
        self._open = None
        self._arena.native.step(start_index, start, end)

    def disable(self) -> None:
        pass

    def drain(self) -> StepRecords:
        records = step_records(self._arena.contents())
        # a continuous session drains once per batch: each batch takes its own iterations'
        records.app_parents, self._app_parents = self._app_parents, {}
        return records

    def counts(self) -> dict[str, Any]:
        """What the arena could not hold (merged into run.json)."""
        return {"arena": dict(self._arena.contents().counts)}


def _synchronizer(device: str):  # type: ignore[no-untyped-def]
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None
