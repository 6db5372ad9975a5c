"""CUPTI's one owner in a process: the native activity session that levels L and G share.

The driver allows one CUPTI subscriber per process, so both levels go through
``cupti_session()``. Buffers are owned natively (``xsp/tracer/native/capture.cpp``): a pool of large
buffers (``XSP_CUPTI_BUFFER_MB`` each, 16 MB by default); a full buffer only joins a queue and
the next comes from the pool, so nothing is decoded inside the measured window: the records are
decoded into columns once, after it, never one Python object per record. When level F runs too, each op
pushes its record id as CUPTI external correlation id, and CUPTI's EXTERNAL_CORRELATION records
join every API call to its op by id. At the end of the run CUPTI is finalized so that nothing
stays attached to the process.

A continuous session (a service) runs CUPTI for its sampled iterations only. Starting CUPTI and
finalizing it cost about 11 ms, and CUPTI left initialized with its RUNTIME and DRIVER kinds
disabled costs every CUDA call until it is finalized; so once the session is known to be
continuous, CUPTI is started with the API calls recorded from its callbacks rather than as
RUNTIME and DRIVER records (``api_callbacks``), and between sampled iterations it is paused
(``suspend``): its kinds disabled and the callbacks' domains switched off, a flush, the records
decoded into native columns, CUPTI left initialized. The next sampled iteration resumes it
(``XSP_CUPTI_SAMPLING=finalize``: start and finalize each time instead; a sample taken in runs,
``--sample-run``, finalizes between runs, whose requests then pay nothing). Each batch boundary
hands the batch's columns over (``hand_over``); each sampled run of CUPTI's records is put on
the Unix epoch's clock with the offset measured as that run ended.
"""

from __future__ import annotations

import logging
import os
import time
from array import array
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from xsp.core import config
from xsp.core.errors import DeviceError, XspError
from xsp.core.records import (
    DEFAULT_DOMAIN,
    ApiRecords,
    GpuRecords,
    Interned,
    RangeRecords,
)
from xsp.core.run_sections import CuptiCounts
from xsp.tracer.capture.hooks.coexist import CUPTI, program_profiler
from xsp.tracer.capture.hooks.cupti_decoded import DecodedCupti, ExternalIds, MarkerColumns

__all__ = [
    "COPY_KINDS",
    "LIBRARY_NVTX_ENV",
    "POOL_BUFFERS",
    "QUIET_API_CALLS",
    "SAMPLED_BUFFER_BYTES",
    "UNSAMPLED_KINDS",
    "cupti_session",
    "nvtx_environment",
]

log = logging.getLogger(__name__)

#: Bookkeeping calls that launch no work but outnumber everything else (measured on ResNet-50
#: training: ~6,700 cudaGetDevice and ~2,200 cuDevicePrimaryCtxGetState per step against ~1,600
#: launches); CUPTI is told not to record them. ``XSP_CUPTI_ALL_API=1`` records them too.
#: cuDNN and cuBLAS call ``cudaFuncSetAttribute`` before many launches (45 per ResNet-18 b2
#: training iteration against 320 launches, ``tests/data/resnet18_train_mflg_cuda_native``).
QUIET_API_CALLS = frozenset(
    {
        "cudaFuncSetAttribute",
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
        "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
        "cuKernelGetFunction",
        "cuLibraryGetKernel",
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

#: Buffers allocated before the window; more are allocated if CUPTI asks for them.
POOL_BUFFERS = 4

#: The activity buffers' size in a continuous session's sampled iterations: each pause flushes
#: CUPTI's buffer, and the first record after the next resume costs CUPTI a fresh buffer, about
#: 1 ms for 16 MB on the H100 (``benchmarks/cupti_sampling_cost.py``); a sampled request's
#: records take far less, and a full buffer only makes CUPTI ask for the next.
SAMPLED_BUFFER_BYTES = 1 << 20

#: Kinds a continuous session's sampled iterations leave out: once enabled, CUPTI's
#: SYNCHRONIZATION kind costs every later CUDA call until CUPTI is finalized, disabled or not
#: (76 µs a batch-1 MLP request on the H100), and CUDA_EVENT's records serve only with it (the
#: replay's cross-stream edges); enabling CUDA_EVENT costs 0.14 ms a sampled iteration.
UNSAMPLED_KINDS = frozenset({"SYNCHRONIZATION", "CUDA_EVENT"})

#: What makes cuBLAS, cuBLASLt and cuDNN emit NVTX ranges named after their API calls.
LIBRARY_NVTX_ENV = {"CUBLAS_NVTX_LEVEL": "1", "CUBLASLT_NVTX_LEVEL": "1", "CUDNN_NVTX_LEVEL": "1"}

#: CUpti_ActivityMemcpyKind values (cupti_activity.h), named as the span schema spells them.
COPY_KINDS = {1: "HTOD", 2: "DTOH", 3: "HTOA", 4: "ATOH", 5: "ATOA", 6: "ATOD", 7: "DTOA"}
COPY_KINDS |= {8: "DTOD", 9: "HTOH", 10: "PTOP"}


def nvtx_environment() -> dict[str, str]:
    """Environment that routes NVTX ranges (the libraries') into CUPTI: the libcupti that the
    native core links, which NVTX must load as its injection library (with two copies in one
    process NVTX would feed the other). It must be in place before a library first calls NVTX:
    ``xsp run`` gives it to each level-set process, and a session sets what is missing."""
    from xsp.tracer.native.build import find_cupti

    env = dict(LIBRARY_NVTX_ENV)
    found = find_cupti()
    library = os.environ.get("NVTX_INJECTION64_PATH") or (str(found.library) if found else None)
    if library:
        env["NVTX_INJECTION64_PATH"] = library
    return env


class _CuptiSession:
    """The process's one CUPTI activity registration, shared by levels L and G."""

    def __init__(self) -> None:
        self.buffer_bytes = config.cupti_buffer_bytes()
        self._native: Any = None
        self._decoded: DecodedCupti | None = None
        self._users = 0
        self._stopped = False
        self._finalized = False
        self._offsets: list[int] = []
        self._window = [0, 0]
        self.dropped_records: int | None = 0
        self.bad_records = 0
        self.buffer_counts: dict[str, int] = {}
        self.graph_error: str | None = None  # why CUDA graph nodes went unrecorded
        self._batch: _Batch | None = None  # the records handed over at a batch boundary
        self._batch_dropped: int | None = None  # None: not in batches (``in_batches``)
        self._kinds: list[str] = []  # what the levels asked CUPTI to record
        self._aside = False  # stepped aside for the program's torch.profiler
        self._collected = False  # records collected on their own clock offsets (stepped aside)
        self._aside_dropped = 0
        self.resume_error: str | None = None
        self._pausable = False  # this CUPTI run pauses between sampled iterations (``suspend``)
        self._paused = False  # CUPTI initialized and paused: the next start resumes it

    def _module(self) -> Any:
        if self._native is None:
            import torch

            # CUPTI without a driver crashes the process instead of returning an error
            if not torch.cuda.is_available():
                raise DeviceError(
                    "levels L and G record CUDA work: no CUDA GPU or driver in this process"
                )
            from xsp.tracer.native.build import load

            native = load()
            if not native.WITH_CUPTI:
                raise DeviceError(
                    "levels L and G need CUPTI, and xsp's native core was built without it: "
                    "no cupti.h and libcupti found (a CUDA build of torch brings them)"
                )
            self._native = native
        return self._native

    def start(self, kinds: tuple[str, ...], pausable: bool = False) -> None:
        """Record ``kinds``. ``pausable``: a continuous session's sampled iterations, between
        which CUPTI pauses (``suspend``) unless ``XSP_CUPTI_SAMPLING=finalize``."""
        native = self._module()
        if self._users == 0:
            self._pausable = pausable and config.cupti_sampling() == "pause"
            _check_exclusive()
            self._stopped = self._finalized = False
            if self._batch_dropped is None:  # a run: its records from here
                self._decoded = None
                self._offsets = [_clock_offset(native)]
                self._window = [time.time_ns(), 0]
                self._collected, self._aside_dropped, self.resume_error = False, 0, None
            self._kinds = []
            # the program's torch.profiler may hold CUPTI now: then xsp starts once it stops
            self._aside = program_profiler().listen(CUPTI, self._step_aside, self._come_back)
        self._kinds += [k for k in kinds if k not in self._kinds]
        if not self._aside:
            if self._users == 0 and self._paused:
                self._resume()
            self._native_start(kinds)
        self._users += 1

    def _resume(self) -> None:
        """A sampled iteration of a continuous session whose CUPTI is paused: on again."""
        self._paused = False
        try:
            self._module().cupti_resume()
        except RuntimeError as exc:
            raise XspError(f"CUPTI refused to resume: {exc}") from exc

    def _native_start(self, kinds: Sequence[str]) -> None:
        native = self._module()
        quiet = [] if config.cupti_all_api() else sorted(QUIET_API_CALLS)
        # a CUPTI that pauses between sampled iterations records the API calls from callbacks,
        # whose domains switch off at no cost to the CUDA calls made meanwhile
        size = self.buffer_bytes
        if self._pausable:
            size = min(size, SAMPLED_BUFFER_BYTES)
            kinds = [k for k in kinds if k not in UNSAMPLED_KINDS]
        try:
            native.cupti_start(list(kinds), size, POOL_BUFFERS, quiet, api_callbacks=self._pausable)
        except RuntimeError as exc:
            raise XspError(f"CUPTI refused to start: {exc}") from exc
        native.cupti_measuring(True)

    def _step_aside(self) -> None:
        """The program's torch.profiler takes CUPTI (``xsp.tracer.capture.hooks.coexist``): the
        records so far are decoded into columns on this run's clock, and CUPTI is left to it."""
        native = self._module()
        native.cupti_measuring(False)
        self._offsets.append(_clock_offset(native))
        self._paused = False
        self._aside_dropped += int(native.cupti_step_aside())
        native.cupti_collect(self.offset_ns, True)
        self._collected, self._aside, self._offsets = True, True, []

    def _come_back(self) -> None:
        """The program's profiler stopped: CUPTI records xsp's kinds again."""
        self._aside = False
        if self._users == 0 or self._stopped:
            return
        native = self._module()
        try:
            self._native_start(self._kinds)
        except XspError as exc:
            self._aside = True  # the rest of the run has no L and G records: counted as held
            self.resume_error = str(exc)
            log.warning("xsp: CUPTI would not start again after the program's profiler: %s", exc)
            return
        self._offsets = [_clock_offset(native)]

    def stop(self) -> None:
        """Flush once, then disable every kind, once no level uses them."""
        native = self._module()
        self._users -= 1
        if self._users > 0 or self._stopped:
            return
        program_profiler().forget(CUPTI)
        self._window[1] = time.time_ns()
        if self._aside:  # stepped aside for the program's profiler: nothing of xsp's runs
            self.dropped_records = self._aside_dropped
            self._stopped = True
            return
        native.cupti_measuring(False)
        offset = _clock_offset(native)  # while CUPTI still runs
        self._offsets = [offset] if self._batch_dropped is not None else [*self._offsets, offset]
        try:
            if self._pausable and self._batch_dropped is not None:
                # kinds and callbacks off, CUPTI initialized: the next start resumes it; its
                # records wait in CUPTI's buffer for the batch boundary's flush
                stopped = int(native.cupti_pause(flush=False))
                self._paused = True
            else:
                stopped = int(native.cupti_stop())
            self.dropped_records = stopped + self._aside_dropped
        except RuntimeError as exc:
            log.warning("xsp: CUPTI cannot report its dropped records: %s", exc)
            self.dropped_records = None
        if self._batch_dropped is not None:
            self._batch_dropped += self.dropped_records or 0
        self._stopped = True

    def in_batches(self) -> None:
        """From now on this process's CUPTI records go out in batches (a continuous session):
        each stop of CUPTI is followed by ``suspend``, and ``hand_over`` ends a batch."""
        if self._batch_dropped is None:
            self._batch_dropped = 0

    def suspend(self) -> None:
        """After ``stop``, in a continuous session's unsampled iterations: decode what CUPTI
        buffered (and the API callbacks recorded) into the native columns, on the clock offset
        measured as it stopped, and leave CUPTI paused: its kinds and callbacks off, still
        initialized, so that the next sampled iteration resumes it rather than paying CUPTI's
        start and finalize again (about 11 ms on the H200). A CUPTI run that recorded API calls
        as RUNTIME and DRIVER records (started before the session was known to be continuous,
        or ``XSP_CUPTI_SAMPLING=finalize``) is finalized instead, with its correlation ids
        numbered on for the next run's (numbered from 1 again): kinds merely disabled would
        leave CUPTI attached, and every CUDA call would pay for it (40-120 µs a batch-1 MLP
        request on the H200, ``benchmarks/cupti_attach_cost.py``)."""
        if self._users > 0 or self._finalized or self._native is None:
            return
        if self._paused:  # its records wait for the batch boundary (``hand_over``)
            return
        self._native.cupti_collect(self._offsets[-1], True)
        self.release()

    def hand_over(self, letter: str) -> _Batch:
        """A continuous session's batch boundary, between iterations: CUPTI's records of the
        batch, decoded into columns on the Unix-epoch clock (flushed here, on the clock offset
        measured now, if CUPTI runs, which it goes on doing, or is paused). Levels L and G
        share one batch:
        the first of them to hand over (or one handing over again) takes the next."""
        native = self._module()
        batch = self._batch
        if batch is None or letter in batch.taken:
            offset = 0  # the finalized runs' records are on the epoch's clock already
            if self._users > 0 or self._paused:  # running, or paused with records unflushed
                offset = _clock_offset(native)
                self._batch_dropped = (self._batch_dropped or 0) + int(native.cupti_flush())
            window = (self._window[0], time.time_ns())
            batch = _Batch(native.cupti_decode(offset), self._batch_dropped or 0, window)
            self._batch, self._batch_dropped = batch, 0
            self._window = [time.time_ns(), 0]
        batch.taken.add(letter)
        return batch

    def release(self) -> None:
        """Detach CUPTI from the process (a lingering CUPTI slows training) once both levels
        have drained."""
        if self._users > 0 or self._native is None or self._finalized:
            return
        self._finalized = True
        try:
            if self._paused:  # its subscriber released, nothing left to record
                self._paused = False
                self._native.cupti_stop()
            self._native.cupti_finalize()
        except RuntimeError as exc:
            log.warning("xsp: CUPTI finalize failed: %s", exc)

    def _decode(self) -> DecodedCupti:
        if self._decoded is None:
            # after a step aside, each CUPTI run's records go on its own clock offset
            offset = self.offset_ns if self._collected else 0
            self._decoded = self._module().cupti_decode(offset)
            counts = self._decoded["counts"]
            self.graph_error, self.bad_records, self.buffer_counts = _decoded_counts(counts)
        return self._decoded

    def counts(self) -> CuptiCounts:
        """What CUPTI lost: records it dropped (its buffers were full) and records xsp could not
        decode; both make the kernel and API counts of the run inexact. Goes into run.json."""
        return _losses(self.dropped_records, self.bad_records, self.buffer_counts, self.graph_error)

    @property
    def offset_ns(self) -> int:
        """Unix-epoch ns minus CUPTI ns, averaged over the calibrations at start and stop."""
        return sum(self._offsets) // max(len(self._offsets), 1)

    def _records(self, batch: _Batch | None) -> tuple[DecodedCupti, int]:
        """The decoded columns and the offset that puts their times on the Unix epoch's clock:
        the run's, or a batch's (whose times are there already, each CUPTI run's as it ended)."""
        if batch is None:
            decoded = self._decode()
            return decoded, 0 if self._collected else self.offset_ns
        return batch.decoded, 0

    def take_api(self, batch: _Batch | None = None) -> ApiRecords:
        """Level L's records: the run's, or a continuous session's ``batch``."""
        decoded, offset = self._records(batch)
        api = decoded["api"]
        out = ApiRecords()
        out.kind = _array("b", api["kind"])
        out.name = Interned.from_codes(_np(api["name"], np.int32), list(api["names"]))
        out.start_ns = _shifted(api["start_ns"], offset)
        out.end_ns = _shifted(api["end_ns"], offset)
        out.correlation = _array("q", api["correlation"])
        out.thread = _array("q", api["thread"])
        correlation = _np(api["correlation"], np.int64)
        out.external_id = _external_ids(decoded["external"], correlation)
        named = decoded.get("named")  # the stream and event a sync, wait or event record names
        if named is not None:
            corr = _np(named["correlation"], np.int64)
            for column in ("stream", "event"):
                values = _np(named[column], np.int64)
                setattr(out, column, _by_correlation(corr, values, correlation, -1))
        self._check_clock(
            _np(out.start_ns, np.int64), self._window if batch is None else batch.window
        )
        out.library = self._library_ranges(decoded["markers"], offset)
        return out

    def take_gpu(self, batch: _Batch | None = None) -> GpuRecords:
        """Level G's records: the run's, or a continuous session's ``batch``."""
        decoded, offset = self._records(batch)
        gpu = decoded["gpu"]
        kind = _np(gpu["kind"], np.int8)
        names = list(gpu["names"])
        codes = _np(gpu["name"], np.int32).copy()
        copy = _np(gpu["copy_kind"], np.int8)
        memcpy_names = {k: len(names) + i for i, k in enumerate(sorted(set(copy[kind == 1])))}
        names += [f"Memcpy {COPY_KINDS.get(int(k), str(k))}" for k in sorted(memcpy_names)]
        names.append("Memset")
        for k, code in memcpy_names.items():
            codes[(kind == 1) & (copy == k)] = code
        codes[kind == 2] = len(names) - 1
        out = GpuRecords()
        out.kind = _array("b", gpu["kind"])
        out.name = Interned.from_codes(codes, names)
        out.start_ns = _shifted(gpu["start_ns"], offset)
        out.end_ns = _shifted(gpu["end_ns"], offset)
        for column in (
            "correlation",
            "device",
            "stream",
            "registers",
            "shared_memory",
            "bytes",
            "graph_node",
        ):
            setattr(out, column, _array("q", gpu[column]))
        out.grid = _triples(_np(gpu["grid"], np.int32), kind == 0)
        out.block = _triples(_np(gpu["block"], np.int32), kind == 0)
        copy_names = [COPY_KINDS.get(int(k), str(k)) for k in range(11)] + [""]
        out.copy_kind = Interned.from_codes(np.where(kind == 1, copy, 11), copy_names)
        out.dropped = (self.dropped_records if batch is None else batch.dropped) or 0
        return out

    def _library_ranges(self, markers: MarkerColumns, offset: int) -> RangeRecords:
        """The closed NVTX ranges of the libraries (every domain but the default one)."""
        domains = list(markers["domains"])
        domain = _np(markers["domain"], np.int32)
        end = _np(markers["end_ns"], np.int64)
        default = domains.index(DEFAULT_DOMAIN) if DEFAULT_DOMAIN in domains else -1
        keep = np.nonzero((domain != default) & (end > 0))[0]
        out = RangeRecords()
        out.domain = Interned.from_codes(domain[keep], domains)
        out.name = Interned.from_codes(_np(markers["name"], np.int32)[keep], list(markers["names"]))
        out.start_ns = _int64s(_np(markers["start_ns"], np.int64)[keep] + offset)
        out.end_ns = _int64s(end[keep] + offset)
        out.thread = _int64s(_np(markers["thread"], np.int64)[keep])
        out.detail = Interned.from_codes(np.zeros(len(keep), np.int32), [""])
        return out

    def _check_clock(self, starts: np.ndarray, window: Sequence[int]) -> None:
        """API calls must fall between enable and disable (``window``); if most do not, CUPTI
        stamped them with another tool's time source (a PyTorch profiler that ran earlier in the
        process)."""
        if not len(starts):
            return
        margin = 1_000_000_000
        inside = (starts >= window[0] - margin) & (starts <= window[1] + margin)
        if inside.mean() < 0.5:
            raise XspError(
                "CUPTI's timestamps are not on the system clock: a PyTorch profiler that ran "
                "earlier in this process set CUPTI's time source; run levels L and G in a fresh "
                "process (xsp run does)"
            )


class _Batch:
    """CUPTI's records of one batch of a continuous session, decoded at its boundary."""

    def __init__(self, decoded: DecodedCupti, dropped: int, window: tuple[int, int]) -> None:
        self.decoded = decoded
        self.dropped = dropped
        self.window = window  # when the batch began and was handed over (Unix-epoch ns)
        self.taken: set[str] = set()  # the levels that handed it over

    def counts(self) -> CuptiCounts:
        graph_error, bad, buffers = _decoded_counts(self.decoded["counts"])
        return _losses(self.dropped, bad, buffers, graph_error)


def _decoded_counts(counts: Any) -> tuple[str | None, int, dict[str, int]]:
    """The native decode's counts: why graph nodes went unrecorded (None: they did not),
    records of unknown kind, and the buffer counts."""
    counts = dict(counts)
    graph_error = str(counts.pop("graph_nodes_unrecorded", "")) or None
    return (
        graph_error,
        int(counts.get("unknown_records", 0)),
        {k: int(v) for k, v in counts.items()},
    )


def _losses(
    dropped: int | None, bad: int, buffers: dict[str, int], graph_error: str | None
) -> CuptiCounts:
    # the buffer counts are the native decode's: CuptiCounts' buffer and record keys
    return cast(
        CuptiCounts,
        {
            "dropped_records": dropped,
            "undecodable_records": bad,
            "undecodable_by_kind": {"unknown kind": bad} if bad else {},
            **buffers,
            **({"graph_nodes_unrecorded": graph_error} if graph_error else {}),
        },
    )


def _np(data: Any, dtype: Any) -> np.ndarray:
    return np.frombuffer(data, dtype=dtype)


def _array(typecode: str, data: bytes) -> array[int]:
    out = array(typecode)
    out.frombytes(data)
    return out


def _int64s(values: np.ndarray) -> array[int]:
    return _array("q", np.ascontiguousarray(values, dtype=np.int64).tobytes())


def _shifted(data: bytes, offset: int) -> array[int]:
    return _int64s(_np(data, np.int64) + offset)


def _triples(values: np.ndarray, valid: np.ndarray) -> Interned:
    """``[x,y,z]`` per kernel (grid or block), "" for copies and sets; formatted once per
    distinct triple."""
    rows = values.reshape(-1, 3)
    if not len(rows):
        return Interned()
    unique, codes = np.unique(rows, axis=0, return_inverse=True)
    texts = [f"[{x},{y},{z}]" for x, y, z in unique.tolist()] + [""]
    return Interned.from_codes(np.where(valid, codes.reshape(-1), len(texts) - 1), texts)


def _by_correlation(
    corr: np.ndarray, values: np.ndarray, correlation: np.ndarray, missing: int
) -> array[int]:
    """For each API call (its ``correlation`` id), the value recorded for its id, ``missing``
    where none was."""
    out = np.full(len(correlation), missing, dtype=np.int64)
    if len(corr):
        order = np.argsort(corr, kind="stable")
        slot = np.clip(np.searchsorted(corr[order], correlation), 0, len(corr) - 1)
        hit = corr[order][slot] == correlation
        out[hit] = values[order][slot][hit]
    return _int64s(out)


def _external_ids(external: ExternalIds, correlation: np.ndarray) -> array[int]:
    """For each API call, the id of the op it ran in (0: none recorded)."""
    corr, ids = _np(external["correlation"], np.int64), _np(external["external"], np.int64)
    return _by_correlation(corr, ids, correlation, 0)


def _clock_offset(native: Any, samples: int = 7) -> int:
    """CUPTI stamps records on its own clock (CLOCK_MONOTONIC-based on the H200 machines seen,
    not CLOCK_REALTIME); read both clocks back to back and keep the tightest pair."""
    best: tuple[int, int] | None = None
    for _ in range(samples):
        before = time.time_ns()
        stamp = native.cupti_timestamp()
        after = time.time_ns()
        if best is None or after - before < best[0]:
            best = (after - before, (before + after) // 2 - stamp)
    assert best is not None
    return best[1]


def _check_exclusive() -> None:
    """Fail clearly when another tool holds CUPTI: the last activity registration wins
    process-wide, so sharing would silently leave one of the two with nothing. (The program's
    own torch.profiler is stepped aside for: ``xsp.tracer.capture.hooks.coexist``.)"""
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
