"""Levels L and G on CUDA, through NVIDIA's cupti-python Activity API.

- L (library): CUDA runtime and driver API calls (RUNTIME, DRIVER activity records).
- G (gpu): kernels (CONCURRENT_KERNEL, never KERNEL, which serializes them), memcpy and memset.

Both levels share one CUPTI activity session per process: the driver allows one subscriber, and
the last callback registration wins process-wide. Buffers are large (``BUFFER_BYTES``, 256 MB by
default) so that none completes inside a measured iteration: records stay in CUPTI's buffers
until ``disable`` flushes them, and the completion callback decodes them into typed arrays then.
At the end of the run CUPTI is finalized so that nothing stays attached to the process.
"""

from __future__ import annotations

import logging
import os
import time
from array import array
from typing import Any

from tracer.errors import DeviceError, XspError
from tracer.records import (
    API_DRIVER,
    API_RUNTIME,
    GPU_KERNEL,
    GPU_MEMCPY,
    GPU_MEMSET,
    ApiRecords,
    GpuRecords,
)

log = logging.getLogger(__name__)

#: Activity buffer size: measured on the H200, 8 MB buffers completing mid-iteration slowed
#: ResNet-50 training up to 4.3x, 256 MB buffers decoded after the window cost 1.02x.
BUFFER_BYTES = int(os.environ.get("XSP_CUPTI_BUFFER_MB", "256")) * 1024 * 1024


class _CuptiSession:
    """The process's one CUPTI activity registration, shared by levels L and G."""

    def __init__(self) -> None:
        self.api = ApiRecords()
        self.gpu = GpuRecords()
        self._cupti: Any = None
        self._kinds: list[Any] = []
        self._users = 0
        self._flushed = False
        self._api_names: dict[tuple[int, int], str] = {}
        self._offsets: list[int] = []
        self._window = [0, 0]
        self._finalized = False

    def _module(self) -> Any:
        if self._cupti is None:
            try:
                from cupti import cupti
            except ImportError as exc:
                raise DeviceError(
                    "levels L and G on CUDA need cupti-python (pip install cupti-python)"
                ) from exc
            self._cupti = cupti
        return self._cupti

    def start(self, kinds: tuple[str, ...]) -> None:
        cupti = self._module()
        if self._users == 0:
            _check_exclusive()
            try:
                cupti.set_thread_id_type(cupti.ActivityThreadIdType.SYSTEM)
                cupti.activity_register_callbacks(self._requested, self._completed)
            except Exception as exc:
                raise XspError(f"CUPTI refused to start: {exc}") from exc
            self._flushed = False
            self._finalized = False
            self._offsets = [_clock_offset(cupti)]
            self._window = [time.time_ns(), 0]
        for name in kinds:
            kind = getattr(cupti.ActivityKind, name)
            try:
                cupti.activity_enable(kind)
            except Exception as exc:
                raise XspError(f"CUPTI cannot record {name}: {exc}") from exc
            self._kinds.append(kind)
        self._users += 1

    def stop(self) -> None:
        """Flush once (decoding every record), then disable the kinds once no level uses them."""
        cupti = self._module()
        if not self._flushed:
            self._window[1] = time.time_ns()
            self._offsets.append(_clock_offset(cupti))
            cupti.activity_flush_all(1)
            self._flushed = True
        self._users -= 1
        if self._users > 0:
            return
        for kind in self._kinds:
            cupti.activity_disable(kind)
        self._kinds = []

    def release(self) -> None:
        """Detach CUPTI from the process (a lingering CUPTI slows training) once every level,
        the profiler-based F level included, has stopped: drains run after all disables."""
        if self._users > 0 or self._cupti is None or self._finalized:
            return
        self._finalized = True
        try:
            self._cupti.finalize()
        except Exception as exc:
            log.warning("xsp: CUPTI finalize failed: %s", exc)

    # -- CUPTI callbacks (called by CUPTI's thread at flush, never inside a measured iteration
    #    while the buffer has room) --------------------------------------------------------------
    def _requested(self) -> tuple[int, int]:
        return BUFFER_BYTES, 0

    def _completed(self, activities: list[Any]) -> None:
        try:
            self._decode(activities)
        except Exception:  # an exception must not escape into CUPTI's thread
            log.exception("xsp: decoding CUPTI records failed")

    def _decode(self, activities: list[Any]) -> None:
        cupti = self._cupti
        kinds = cupti.ActivityKind
        api, gpu = self.api, self.gpu
        for record in activities:
            kind = record.kind
            if kind == kinds.CONCURRENT_KERNEL:
                gpu.kind.append(GPU_KERNEL)
                gpu.name.append(record.name or "?")
                gpu.grid.append(f"[{record.grid_x},{record.grid_y},{record.grid_z}]")
                gpu.block.append(f"[{record.block_x},{record.block_y},{record.block_z}]")
                gpu.registers.append(record.registers_per_thread)
                gpu.shared_memory.append(record.static_shared_memory + record.dynamic_shared_memory)
                gpu.bytes.append(-1)
                gpu.copy_kind.append("")
            elif kind == kinds.MEMCPY or kind == kinds.MEMSET:
                is_copy = kind == kinds.MEMCPY
                copy = cupti.ActivityMemcpyKind(record.copy_kind).name if is_copy else ""
                gpu.kind.append(GPU_MEMCPY if is_copy else GPU_MEMSET)
                gpu.name.append(f"Memcpy {copy}" if is_copy else "Memset")
                gpu.grid.append("")
                gpu.block.append("")
                gpu.registers.append(-1)
                gpu.shared_memory.append(-1)
                gpu.bytes.append(record.bytes)
                gpu.copy_kind.append(copy)
            elif kind == kinds.EXTERNAL_CORRELATION:
                api.external_correlation.append(record.correlation_id)
                api.external_id.append(record.external_id)
                continue
            elif kind == kinds.RUNTIME or kind == kinds.DRIVER:
                is_runtime = kind == kinds.RUNTIME
                api.kind.append(API_RUNTIME if is_runtime else API_DRIVER)
                api.name.append(self._api_name(is_runtime, record.cbid))
                api.start_ns.append(record.start)
                api.end_ns.append(record.end)
                api.correlation.append(record.correlation_id)
                api.thread.append(record.thread_id)
                continue
            else:
                continue
            gpu.start_ns.append(record.start)
            gpu.end_ns.append(record.end)
            gpu.correlation.append(record.correlation_id)
            gpu.device.append(record.device_id)
            gpu.stream.append(record.stream_id)

    def _api_name(self, is_runtime: bool, cbid: int) -> str:
        key = (int(is_runtime), cbid)
        name = self._api_names.get(key)
        if name is None:
            enum = (
                self._cupti.runtime_api_trace_cbid
                if is_runtime
                else self._cupti.driver_api_trace_cbid
            )
            try:
                name = enum(cbid).name.rsplit("_v", 1)[
                    0
                ]  # cudaLaunchKernel_v7000 -> cudaLaunchKernel
            except ValueError:
                name = f"{'cuda' if is_runtime else 'cu'}API#{cbid}"
            self._api_names[key] = name
        return name

    @property
    def offset_ns(self) -> int:
        """Unix-epoch ns minus CUPTI ns, averaged over the calibrations at start and stop."""
        return sum(self._offsets) // max(len(self._offsets), 1)

    def take_api(self) -> ApiRecords:
        records, self.api = self.api, ApiRecords()
        _shift(records.start_ns, self.offset_ns)
        _shift(records.end_ns, self.offset_ns)
        self._check_clock(records.start_ns)
        return records

    def _check_clock(self, starts: array[int]) -> None:
        """API calls must fall between enable and disable; if most do not, CUPTI stamped them
        with another tool's time source (a PyTorch profiler that ran earlier in the process)."""
        import numpy as np

        if not len(starts):
            return
        values = np.frombuffer(starts, dtype=np.int64)
        margin = 1_000_000_000
        inside = (values >= self._window[0] - margin) & (values <= self._window[1] + margin)
        if inside.mean() < 0.5:
            raise XspError(
                "CUPTI's timestamps are not on the system clock: a PyTorch profiler that ran "
                "earlier in this process set CUPTI's time source; run levels L and G in a fresh "
                "process (xsp run does)"
            )

    def take_gpu(self) -> GpuRecords:
        records, self.gpu = self.gpu, GpuRecords()
        _shift(records.start_ns, self.offset_ns)
        _shift(records.end_ns, self.offset_ns)
        try:
            records.dropped = int(self._module().activity_get_num_dropped_records(0, 0, 0) or 0)
        except Exception:
            records.dropped = 0
        return records


def _clock_offset(cupti: Any, samples: int = 7) -> int:
    """CUPTI stamps records on its own clock (CLOCK_MONOTONIC-based on the H200 machines seen,
    not CLOCK_REALTIME); read both clocks back to back and keep the tightest pair."""
    best: tuple[int, int] | None = None
    for _ in range(samples):
        before = time.time_ns()
        stamp = cupti.get_timestamp()
        after = time.time_ns()
        if best is None or after - before < best[0]:
            best = (after - before, (before + after) // 2 - stamp)
    assert best is not None
    return best[1]


def _shift(values: array[int], offset: int) -> None:
    import numpy as np

    if len(values):
        view = np.frombuffer(values, dtype=np.int64)
        view += offset


def _check_exclusive() -> None:
    """Fail clearly when another tool holds CUPTI: on this driver the last activity registration
    wins process-wide, so sharing would silently leave one of the two with nothing."""
    import torch

    from tracer.levels import framework

    if torch.autograd._profiler_enabled() and not framework.owns_profiler():
        raise XspError(
            "torch.profiler is running in this process; it and xsp's levels L and G "
            "cannot share CUPTI: stop the profiler or drop levels L and G"
        )
    injected = os.environ.get("CUDA_INJECTION64_PATH")
    if injected:
        raise XspError(
            f"another CUDA profiler is injected into this process "
            f"(CUDA_INJECTION64_PATH={injected}: nsys or ncu); it holds CUPTI"
        )


_session: _CuptiSession | None = None


def cupti_session() -> _CuptiSession:
    global _session
    if _session is None:
        _session = _CuptiSession()
    return _session


class LibraryLevel:
    """Level L on CUDA: runtime and driver API calls."""

    letter = "L"
    kinds: tuple[str, ...] = ("RUNTIME", "DRIVER", "EXTERNAL_CORRELATION")

    def __init__(self) -> None:
        self._session = cupti_session()

    def enable(self) -> None:
        self._session.start(self.kinds)

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


class GpuLevel(LibraryLevel):
    """Level G: kernels, memcpys and memsets."""

    letter = "G"
    kinds: tuple[str, ...] = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET")

    def drain(self) -> GpuRecords:  # type: ignore[override]
        records = self._session.take_gpu()
        self._session.release()
        return records
