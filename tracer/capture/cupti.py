"""CUPTI's one owner in a process: the activity session that levels F (NVTX ranges), L and G all
use, and the record of who runs the PyTorch profiler.

The driver allows one CUPTI subscriber per process, and the last callback registration wins
process-wide, so every level goes through ``cupti_session()``. Buffers are large
(``XSP_CUPTI_BUFFER_MB``, 256 MB by default, read by ``xsp.tracer.config`` when the session is
built) so that none completes inside a measured iteration: records stay in CUPTI's buffers until
the last user stops the session, and the completion callback decodes them into typed arrays
then. At the end of the run CUPTI is finalized so that nothing stays attached to the process.
"""

from __future__ import annotations

import logging
import os
import time
from array import array
from typing import Any

from xsp.tracer import config
from xsp.tracer.convert.records import (
    API_DRIVER,
    API_RUNTIME,
    DEFAULT_DOMAIN,
    GPU_KERNEL,
    GPU_MEMCPY,
    GPU_MEMSET,
    ApiRecords,
    GpuRecords,
    RangeRecords,
)
from xsp.tracer.errors import DeviceError, XspError

log = logging.getLogger(__name__)

#: Bookkeeping calls that launch no work but outnumber everything else (measured on ResNet-50
#: training: ~6,700 cudaGetDevice and ~2,200 cuDevicePrimaryCtxGetState per step against ~1,600
#: launches); CUPTI is told not to record them. ``XSP_CUPTI_ALL_API=1`` records them too.
QUIET_API_CALLS = frozenset(
    {
        "cudaGetDevice",
        "cudaGetDeviceCount",
        "cudaGetLastError",
        "cudaPeekAtLastError",
        "cudaGetErrorString",
        "cudaStreamIsCapturing",
        "cudaDeviceGetAttribute",
        "cudaGetDeviceProperties",
        "cudaPointerGetAttributes",
        "cudaFuncGetAttributes",
        "cudaGetFuncBySymbol",
        "cuDevicePrimaryCtxGetState",
        "cuKernelGetName",
        "cuFuncGetName",
        "cuCtxGetCurrent",
        "cuCtxGetDevice",
        "cuDeviceGet",
        "cuDeviceGetAttribute",
        "cuGetProcAddress",
        "cuGetErrorString",
    }
)

#: CUpti_ActivityFlag bits of NVTX range records (cupti-python 13.0 names no MARKER_END).
_MARKER_START, _MARKER_END = 1 << 1, 1 << 2

#: What makes cuBLAS, cuBLASLt and cuDNN emit NVTX ranges named after their API calls.
LIBRARY_NVTX_ENV = {"CUBLAS_NVTX_LEVEL": "1", "CUBLASLT_NVTX_LEVEL": "1", "CUDNN_NVTX_LEVEL": "1"}


def cupti_library() -> str | None:
    """Path of the libcupti that cupti-python loads, which NVTX must load as its injection
    library: with two copies in one process, NVTX would feed one CUPTI and we would read the
    other. Read from the process's mappings once cupti-python has loaded it."""
    try:
        from cupti import cupti

        cupti.get_timestamp()  # makes cupti-python load its library
    except Exception:
        return None
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if "libcupti.so" in os.path.basename(path):
                    return path
    except OSError:
        pass
    return None


def nvtx_environment() -> dict[str, str]:
    """Environment that routes NVTX ranges (PyTorch's and the libraries') into CUPTI. It must be
    in place before a library first calls NVTX: ``xsp run`` gives it to each level-set process,
    and a session sets what is missing when it is created."""
    env = dict(LIBRARY_NVTX_ENV)
    library = os.environ.get("NVTX_INJECTION64_PATH") or cupti_library()
    if library:
        env["NVTX_INJECTION64_PATH"] = library
    return env


class _CuptiSession:
    """The process's one CUPTI activity registration, shared by levels L and G."""

    def __init__(self) -> None:
        self.buffer_bytes = config.cupti_buffer_bytes()
        self.api = ApiRecords()
        self.gpu = GpuRecords()
        self.ranges = RangeRecords()
        self._open_ranges: dict[int, int] = {}  # NVTX range id -> row of its start
        self._cupti: Any = None
        self._kinds: list[Any] = []
        self._users = 0
        self._flushed = False
        self._api_names: dict[tuple[int, int], str] = {}
        self._offsets: list[int] = []
        self.bad_records = 0  # records that could not be decoded (skipped)
        self.bad_kinds: dict[str, int] = {}  # ... by activity kind
        self.dropped_records: int | None = 0  # dropped by CUPTI (full buffers); None: unknown
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
            self.bad_records, self.bad_kinds, self.dropped_records = 0, {}, 0
            self.ranges, self._open_ranges = RangeRecords(), {}
            self._offsets = [_clock_offset(cupti)]
            self._window = [time.time_ns(), 0]
        for name in kinds:
            kind = getattr(cupti.ActivityKind, name)
            if kind in self._kinds:
                continue
            try:
                cupti.activity_enable(kind)
            except Exception as exc:
                raise XspError(f"CUPTI cannot record {name}: {exc}") from exc
            self._kinds.append(kind)
            if name in ("RUNTIME", "DRIVER") and not config.cupti_all_api():
                self._quiet(name == "RUNTIME")
        self._users += 1

    def _quiet(self, runtime: bool) -> None:
        """Stop CUPTI from recording the bookkeeping calls of ``QUIET_API_CALLS``."""
        cupti = self._cupti
        ids = cupti.runtime_api_trace_cbid if runtime else cupti.driver_api_trace_cbid
        switch = cupti.activity_enable_runtime_api if runtime else cupti.activity_enable_driver_api
        for member in ids:
            if member.name.rsplit("_v", 1)[0] in QUIET_API_CALLS:
                try:
                    switch(member, 0)
                except Exception as exc:  # older CUPTI: record everything
                    log.info("xsp: CUPTI records every API call (%s)", exc)
                    return

    def stop(self) -> None:
        """Flush once (decoding every record), then disable the kinds once no level uses them."""
        cupti = self._module()
        if not self._flushed:
            self._window[1] = time.time_ns()
            self._offsets.append(_clock_offset(cupti))
            cupti.activity_flush_all(1)
            self._flushed = True
            self.dropped_records = dropped_records(cupti)
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
        return self.buffer_bytes, 0

    def _completed(self, activities: list[Any]) -> None:
        try:
            self._decode(activities)
        except Exception:  # an exception must not escape into CUPTI's thread
            self.bad_records += len(activities) if isinstance(activities, list) else 1
            log.exception("xsp: decoding CUPTI records failed")

    def counts(self) -> dict[str, Any]:
        """What CUPTI lost: records it dropped (its buffers were full) and records xsp could not
        decode; both make the kernel and API counts of the run inexact. Goes into run.json."""
        return {
            "dropped_records": self.dropped_records,
            "undecodable_records": self.bad_records,
            "undecodable_by_kind": dict(self.bad_kinds),
        }

    def _decode(self, activities: list[Any]) -> None:
        kinds = self._cupti.ActivityKind
        gpu_kinds = (kinds.CONCURRENT_KERNEL, kinds.MEMCPY, kinds.MEMSET)
        api_kinds = (kinds.RUNTIME, kinds.DRIVER)
        for record in activities:
            try:  # each record is read whole before any column grows, so columns stay aligned
                kind = record.kind
                if kind in gpu_kinds:
                    self._append_gpu(self._read_gpu(record, kind))
                elif kind in api_kinds:
                    self._append_api(self._read_api(record, kind == kinds.RUNTIME))
                elif kind == kinds.MARKER:
                    self._decode_marker(record)
            except Exception:  # one odd record must not cost the rest of the buffer
                self.bad_records += 1
                name = str(getattr(getattr(record, "kind", None), "name", "unknown"))
                self.bad_kinds[name] = self.bad_kinds.get(name, 0) + 1
                if self.bad_records == 1:
                    log.exception("xsp: a CUPTI record could not be decoded; skipping such records")

    def _read_gpu(self, record: Any, kind: Any) -> tuple[Any, ...]:
        cupti = self._cupti
        timing = (record.start, record.end, record.correlation_id, record.device_id)
        if kind == cupti.ActivityKind.CONCURRENT_KERNEL:
            return (
                GPU_KERNEL,
                record.name or "?",
                f"[{record.grid_x},{record.grid_y},{record.grid_z}]",
                f"[{record.block_x},{record.block_y},{record.block_z}]",
                record.registers_per_thread,
                record.static_shared_memory + record.dynamic_shared_memory,
                -1,
                "",
                *timing,
                record.stream_id,
            )
        if kind == cupti.ActivityKind.MEMCPY:
            copy = cupti.ActivityMemcpyKind(record.copy_kind).name
            head: tuple[Any, ...] = (GPU_MEMCPY, f"Memcpy {copy}", "", "", -1, -1, record.bytes)
            return (*head, copy, *timing, record.stream_id)
        return (GPU_MEMSET, "Memset", "", "", -1, -1, record.bytes, "", *timing, record.stream_id)

    def _append_gpu(self, row: tuple[Any, ...]) -> None:
        gpu = self.gpu
        columns: tuple[Any, ...] = (gpu.kind, gpu.name, gpu.grid, gpu.block, gpu.registers)
        columns += (gpu.shared_memory, gpu.bytes, gpu.copy_kind, gpu.start_ns, gpu.end_ns)
        for column, value in zip(
            (*columns, gpu.correlation, gpu.device, gpu.stream), row, strict=True
        ):
            column.append(value)

    def _read_api(self, record: Any, is_runtime: bool) -> tuple[Any, ...]:
        name = self._api_name(is_runtime, record.cbid)
        kind = API_RUNTIME if is_runtime else API_DRIVER
        return (kind, name, record.start, record.end, record.correlation_id, record.thread_id)

    def _append_api(self, row: tuple[Any, ...]) -> None:
        api = self.api
        columns: tuple[Any, ...] = (api.kind, api.name, api.start_ns, api.end_ns)
        columns += (api.correlation, api.thread)
        for column, value in zip(columns, row, strict=True):
            column.append(value)

    def _decode_marker(self, record: Any) -> None:
        """An NVTX push/pop or start/end range arrives as a start record (name, domain, thread)
        and an end record with the same id; instantaneous markers are ignored."""
        flags = int(record.flags_)
        ranges = self.ranges
        if flags & _MARKER_START:
            domain, name = record.domain or DEFAULT_DOMAIN, record.name or ""
            start, thread = record.timestamp, int(record.object_id.pt.thread_id)
            self._open_ranges[record.id] = len(ranges.start_ns)
            ranges.domain.append(domain)
            ranges.name.append(name)
            ranges.start_ns.append(start)
            ranges.end_ns.append(0)
            ranges.thread.append(thread)
            ranges.detail.append("")
        elif flags & _MARKER_END:
            row = self._open_ranges.pop(record.id, None)
            if row is not None:
                ranges.end_ns[row] = record.timestamp

    def take_ranges(self, default_domain: bool) -> RangeRecords:
        """The closed NVTX ranges of the default domain (PyTorch's) or of the other domains
        (the libraries'), on the Unix-epoch clock."""
        import numpy as np

        ranges = self.ranges
        domains = np.frombuffer(ranges.domain.codes, dtype=np.int32)
        default_code = (
            ranges.domain.values.index(DEFAULT_DOMAIN)
            if DEFAULT_DOMAIN in ranges.domain.values
            else -1
        )
        wanted = (domains == default_code) if default_domain else (domains != default_code)
        end = np.frombuffer(ranges.end_ns, dtype=np.int64)
        out = RangeRecords()
        offset = self.offset_ns
        for row in np.nonzero(wanted & (end > 0))[0].tolist():
            out.domain.append(ranges.domain.values[ranges.domain.codes[row]])
            out.name.append(ranges.name.values[ranges.name.codes[row]])
            out.start_ns.append(ranges.start_ns[row] + offset)
            out.end_ns.append(ranges.end_ns[row] + offset)
            out.thread.append(ranges.thread[row])
            out.detail.append("")
        return out

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
        records.library = self.take_ranges(default_domain=False)
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
        records.dropped = self.dropped_records or 0
        return records


def dropped_records(cupti: Any) -> int | None:
    """Records CUPTI dropped because no buffer had room, over CUPTI's global buffers (context 0,
    stream 0: the ones the registered callbacks use). None when CUPTI cannot say, so that a run
    never claims a count it could not read. cupti-python binds the C call 1:1; depending on the
    release it returns the count or fills the ``size_t`` whose address it is given."""
    try:
        try:
            count = cupti.activity_get_num_dropped_records(0, 0)
        except TypeError:
            import ctypes

            out = ctypes.c_size_t(0)
            count = cupti.activity_get_num_dropped_records(0, 0, ctypes.addressof(out))
            count = out.value if count is None else count
        return int(count or 0)
    except Exception as exc:
        log.warning("xsp: CUPTI cannot report its dropped records: %s", exc)
        return None


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

    if torch.autograd._profiler_enabled() and _profiler_owner is None:
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


_profiler_owner: object | None = None


def claim_profiler(owner: object) -> None:
    """Level F runs the PyTorch profiler (Kineto or its NVTX observer) on xsp's behalf."""
    global _profiler_owner
    _profiler_owner = owner


def release_profiler(owner: object) -> bool:
    """Level F stopped its profiler; False when ``owner`` did not hold it."""
    global _profiler_owner
    if _profiler_owner is not owner:
        return False
    _profiler_owner = None
    return True


def owns_profiler(owner: object) -> bool:
    return _profiler_owner is owner
