"""Levels L and G on CUDA, through CUPTI's Activity API, owned by xsp's native core.

- L (library): CUDA runtime and driver API calls (RUNTIME, DRIVER activity records, with the
  stream and event that syncs, stream waits and event records name: SYNCHRONIZATION, CUDA_EVENT)
  and the cuBLAS, cuBLASLt and cuDNN calls around them, from the NVTX ranges those libraries emit when
  ``CUBLAS_NVTX_LEVEL`` and friends are set and NVTX is injected into CUPTI (MARKER records).
  With level F in the process, EXTERNAL_CORRELATION records name the op of each API call.
- G (gpu): kernels (CONCURRENT_KERNEL, never KERNEL, which serializes them), memcpy and memset.

Both share the process's one CUPTI activity session, ``xsp.tracer.capture.cupti``.
"""

from __future__ import annotations

import logging
from typing import Any

from xsp.tracer.capture.cupti import cupti_session
from xsp.tracer.convert.records import (
    ApiRecords,
    GpuRecords,
)

log = logging.getLogger(__name__)


class LibraryLevel:
    """Level L on CUDA: runtime and driver API calls, and cuBLAS/cuDNN calls (NVTX ranges)."""

    letter = "L"
    kinds: tuple[str, ...] = ("RUNTIME", "DRIVER", "MARKER", "SYNCHRONIZATION", "CUDA_EVENT")

    def __init__(self, with_ops: bool = False) -> None:
        self._session = cupti_session()
        self._kinds = self.kinds + (("EXTERNAL_CORRELATION",) if with_ops else ())

    def enable(self) -> None:
        self._session.start(self._kinds)

    def begin_iteration(self, index: int) -> None:
        pass

    def end_iteration(self, index: int) -> None:
        pass

    def disable(self) -> None:
        self._session.stop()

    def drain(self) -> ApiRecords:
        records = self._session.take_api()
        self._session.release()
        return records

    def counts(self) -> dict[str, Any]:
        """CUPTI's losses for run.json (the session asks every level that has ``counts``)."""
        return {"cupti": self._session.counts()}


class GpuLevel(LibraryLevel):
    """Level G: kernels, memcpys and memsets."""

    letter = "G"
    kinds: tuple[str, ...] = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET")

    def drain(self) -> GpuRecords:  # type: ignore[override]
        records = self._session.take_gpu()
        self._session.release()
        return records
