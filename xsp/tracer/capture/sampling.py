"""Which iterations of a continuous session the levels below M record: the sampling policy.

Level M records every iteration (one step record: cheap enough for every request). The deeper
levels (F, L, G) cost per op, per call and per kernel, so a service traces them on a sample::

    every N          1 iteration in N: iterations 0, N, 2N, ... of the measurement
    at most R/s      an iteration is sampled when at least 1/R seconds have passed since the
                     last sampled one began (the first is always sampled)
    in runs of K     the sample comes in runs of K consecutive iterations, as often in all:
                     iterations 0..K-1, NK..NK+K-1, ...; at most R/s starts a run when K/R
                     seconds have passed since the last run began

Both N and R may be given: an iteration is sampled when both say so. The decision is made when
an iteration begins, before any of its records are written, and unsampled iterations have the
deeper levels switched off at the source (``Level.sample``): they pay nothing for them and
leave nothing to drop later (docs/serving.md has the measurement behind that choice).

Runs are for levels L and G on CUDA: between two runs CUPTI is finalized, so the unsampled
requests pay nothing for it, and its start and finalize (about 11 ms) are paid once a run
instead of once a sampled request (``xsp.tracer.capture.hooks.cupti``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["SamplingPolicy"]


class SamplingPolicy:
    def __init__(
        self,
        every: int = 1,
        rate: float | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        run: int = 1,
    ) -> None:
        self.every = every
        self.run = run
        self._gap_ns = int(run * 1e9 / rate) if rate is not None else 0
        self._clock = clock
        self._last_ns: int | None = None  # when the last run began
        self._left = 0  # iterations left in the run under way (a rate's)
        self.sampled = 0  # iterations sampled so far

    @property
    def samples_all(self) -> bool:
        return self.every == 1 and self._gap_ns == 0

    def sample(self, index: int) -> bool:
        """Whether measured iteration ``index``, beginning now, is traced at the deeper levels."""
        if (index // self.run) % self.every:
            return False
        if self._gap_ns:
            if self._left == 0:
                now = self._clock()
                if self._last_ns is not None and now - self._last_ns < self._gap_ns:
                    return False
                self._last_ns, self._left = now, self.run
            self._left -= 1
        self.sampled += 1
        return True

    def unsampled_from(self, index: int) -> int | None:
        """How many iterations from ``index`` on are not sampled, whenever they begin (None: the
        policy also decides by time)."""
        if self._gap_ns:
            return None
        period = self.every * self.run
        position = index % period
        return 0 if position < self.run else period - position

    def describe(self) -> dict[str, float | int | None]:
        """As run.json keeps it."""
        return {
            "every": self.every,
            "max_per_s": self.run * 1e9 / self._gap_ns if self._gap_ns else None,
            "run": self.run,
            "sampled": self.sampled,
        }
