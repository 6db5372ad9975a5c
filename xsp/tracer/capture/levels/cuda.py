"""Levels L and G on CUDA, through CUPTI's Activity API, owned by xsp's native core.

- L (library): CUDA runtime and driver API calls (RUNTIME, DRIVER activity records, with the
  stream and event that syncs, stream waits and event records name: SYNCHRONIZATION, CUDA_EVENT)
  and the cuBLAS, cuBLASLt and cuDNN calls around them, from the NVTX ranges those libraries emit when
  ``CUBLAS_NVTX_LEVEL`` and friends are set and NVTX is injected into CUPTI (MARKER records).
  With level F in the process, EXTERNAL_CORRELATION records name the op of each API call.
- G (gpu): kernels (CONCURRENT_KERNEL, never KERNEL, which serializes them), memcpy and memset.

Both share the process's one CUPTI activity session, ``xsp.tracer.capture.hooks.cupti``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from xsp.core.run_sections import RunCounts
from xsp.tracer.capture.hooks.coexist import CUPTI, program_profiler
from xsp.tracer.capture.hooks.cupti import cupti_session

if TYPE_CHECKING:
    from xsp.core.arena import ArenaContents
    from xsp.tracer.capture.levels import LevelContext
    from xsp.tracer.export.batches import BatchDrain

__all__ = ["GpuLevel", "LibraryLevel", "build_gpu", "build_library"]

log = logging.getLogger(__name__)


class LibraryLevel:
    """Level L on CUDA: runtime and driver API calls, and cuBLAS/cuDNN calls (NVTX ranges).

    In a continuous session CUPTI runs for the sampled iterations only: sampled off, the level
    stops it (the last level to stop pauses it, ``suspend``: kinds and API callbacks off, CUPTI
    still initialized); sampled on, it resumes, as the policy switches it on, or else as the
    sampled iteration begins (the first one after a batch boundary). A sample in runs of
    several iterations (``pause`` False) finalizes CUPTI between runs instead: the requests
    between them pay nothing for it, and its start is paid once a run."""

    letter = "L"
    kinds: tuple[str, ...] = ("RUNTIME", "DRIVER", "MARKER", "SYNCHRONIZATION", "CUDA_EVENT")

    def __init__(self, with_ops: bool = False, pause: bool = True) -> None:
        self._session = cupti_session()
        self._pause = pause  # between sampled iterations CUPTI pauses, else it is finalized
        self._kinds = self.kinds + (("EXTERNAL_CORRELATION",) if with_ops else ())
        self._running = False  # CUPTI started by this level and not stopped
        self._wanted = False  # the iterations from the next one on are recorded
        self._batches = False  # a continuous session hands its records over in batches
        self.start_failures = 0  # sampled iterations whose CUPTI would not start

    def enable(self) -> None:
        """Come on. After a batch's hand-over CUPTI starts with the next sampled iteration."""
        program_profiler().run_begins()
        program_profiler().cupti_letters.add(self.letter)
        self._wanted = True
        if not self._batches:
            self._start()

    def sample(self, on: bool) -> None:
        """A continuous session's sampling policy, between iterations: record the iterations
        from the next one on, or not."""
        self._in_batches()
        self._wanted = on
        if on:
            self._start()
        elif self._running:
            self._running = False
            self._session.stop()
            self._session.suspend()

    def begin_iteration(self, index: int) -> None:
        """A sampled iteration right after a batch boundary starts CUPTI here; a CUPTI that
        refuses to start costs this iteration its records, never the program its request."""
        if self._wanted:
            program_profiler().begin_iteration(CUPTI, index)
        try:
            self._start()
        except Exception as exc:
            self._wanted = False
            self.start_failures += 1
            if self.start_failures == 1:
                log.warning("xsp: level %s could not start CUPTI: %s", self.letter, exc)

    def end_iteration(self, index: int) -> None:
        if self._wanted:  # an iteration the program's torch.profiler held CUPTI in is counted
            program_profiler().end_iteration(CUPTI, index)

    def handover(self) -> BatchDrain:
        """A continuous session's batch boundary: this batch's records, decoded now (CUPTI
        goes on if it runs)."""
        self._in_batches()
        batch = self._session.hand_over(self.letter)

        failures, self.start_failures = self.start_failures, 0

        def drain(contents: ArenaContents) -> tuple[Any, RunCounts]:
            return self._take(batch), {"cupti": {**batch.counts(), "start_failures": failures}}

        return drain

    def disable(self) -> None:
        self._wanted = False
        if self._running:
            self._running = False
            self._session.stop()
        if self._batches:  # every batch was handed over: nothing is left to drain
            self._session.release()

    def _in_batches(self) -> None:
        """Only a continuous session samples and hands over: its records go out in batches."""
        if not self._batches:
            self._batches = True
            self._session.in_batches()

    def _start(self) -> None:
        if self._wanted and not self._running:
            # a continuous session's sampled iterations: CUPTI pauses between them
            self._session.start(self._kinds, pausable=self._batches and self._pause)
            self._running = True

    def _take(self, batch: Any = None) -> Any:
        return self._session.take_api(batch)

    def drain(self) -> Any:
        records = self._take()
        self._session.release()
        return records

    def counts(self) -> RunCounts:
        """CUPTI's losses for run.json (the session asks every level that has ``counts``), and
        what the program's torch.profiler kept from it (``xsp.tracer.capture.hooks.coexist``)."""
        counts: RunCounts = {"cupti": self._session.counts()}
        if program := program_profiler().summary():
            counts["program_profiler"] = program
        if self._session.resume_error:
            counts["cupti"]["resume_error"] = self._session.resume_error
        return counts


class GpuLevel(LibraryLevel):
    """Level G: kernels, memcpys and memsets."""

    letter = "G"
    kinds: tuple[str, ...] = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET")

    def _take(self, batch: Any = None) -> Any:
        return self._session.take_gpu(batch)


def build_library(ctx: LevelContext) -> LibraryLevel:
    """Level L of a session on CUDA (its row in ``xsp.core.levels`` names this factory)."""
    return LibraryLevel(with_ops=ctx.levels.framework, pause=ctx.sample_run == 1)


def build_gpu(ctx: LevelContext) -> GpuLevel:
    """Level G of a session (its row in ``xsp.core.levels`` names this factory)."""
    return GpuLevel(with_ops=ctx.levels.framework, pause=ctx.sample_run == 1)
