"""A session's progress callback: (phase, done, total) after each iteration, a continuous
session's measured ones at most every ``PROGRESS_EVERY_S``."""

from __future__ import annotations

import time
from collections.abc import Callable

from xsp.tracer.capture.run_errors import RunErrors

__all__ = ["PROGRESS_EVERY_S", "Progress", "ProgressCallback"]

ProgressCallback = Callable[[str, int, int], None]  # (phase, done, total)
#: A continuous session reports its measured iterations at most this often.
PROGRESS_EVERY_S = 0.5


class Progress:
    """Reports a session's iterations to its callback, if it has one; a callback that fails is
    a misuse (logged once), never the traced program's exception."""

    def __init__(self, callback: ProgressCallback | None, continuous: bool, errors: RunErrors):
        self._callback = callback
        self._continuous = continuous
        self._errors = errors
        self._at = 0.0  # monotonic: the last continuous report

    @property
    def next_due(self) -> float | None:
        """When a continuous session's next report is due (monotonic); None: no callback."""
        return self._at + PROGRESS_EVERY_S if self._callback is not None else None

    def report(self, index: int, warmup: int, iterations: int) -> None:
        """``index`` iterations ended, ``warmup`` of them warm-up, of ``iterations`` measured."""
        if self._callback is None:
            return
        try:
            if index <= warmup:
                self._callback("warmup", index, warmup)
            elif self._continuous:  # a service's thousands a second: a line now and then
                now = time.monotonic()
                if now - self._at >= PROGRESS_EVERY_S:
                    self._at = now
                    self._callback("measure", index - warmup, iterations)
            else:
                self._callback("measure", index - warmup, iterations)
        except Exception:
            self._errors.misuse("the progress callback failed")
