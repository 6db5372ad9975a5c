"""Level F: nn.Module (layer) spans and aten operator spans, forward and backward.

Capture uses two cheap sources that share one clock:

1. PyTorch's own operator observer (the Kineto profiler with only the CPU activity and input
   shapes) records every aten op, autograd node and optimizer range, with thread, times, input
   shapes/dtypes and autograd sequence numbers, in C++ buffers.
2. Global module forward hooks open a profiler range ``xsp::module::<call>`` around each
   nn.Module call, so module ranges live in the same buffers, on the same clock, nested with the
   ops they run. The hooks only append (module index, input shapes, output shapes) to lists.

Nothing is turned into spans during the measured window; ``drain`` copies the profiler's events into
plain lists after it, and ``xsp.tracer.convert.spans`` nests them.

On CUDA, when level L or G runs in the same process, source 1 changes: Kineto would hold CUPTI
(on CUDA builds its CPU activity records CUDA calls through CUPTI), and CUPTI has one owner per
process. PyTorch's NVTX observer (the ``emit_nvtx`` profiler state) then emits every op as an NVTX
range, named ``aten::conv2d, seq = 12, op_id = 40, sizes = [[...]]``, that CUPTI records as MARKER
records next to the library ranges, API calls and kernels: one clock, OS thread ids throughout.
The module and step ranges ride along unchanged. What NVTX does not carry: input dtypes.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch._C._autograd import _KinetoEvent
from torch.autograd import (
    ProfilerActivity,
    ProfilerConfig,
    ProfilerState,
    _disable_profiler,
    _enable_profiler,
    _prepare_profiler,
)
from torch.nn.modules import module as nn_module

from xsp.tracer.capture import cupti
from xsp.tracer.convert.records import (
    BACKWARD_PREFIX,
    MODULE_RANGE_PREFIX,
    STEP_RANGE_PREFIX,
    FrameworkRecords,
    ModuleInfo,
    RangeRecords,
)
from xsp.tracer.errors import XspError

log = logging.getLogger(__name__)

HOST_ACTIVITY_TYPES = frozenset(
    {"cpu_op", "user_annotation", "cpu_instant_event", "python_function"}
)
_CUDA_API_NAME = re.compile(r"cu(da)?[A-Z]")

try:  # a C++ context manager: about 1 µs per range, against ~5 µs for record_function
    from torch._C._profiler import _RecordFunctionFast as _Range
except ImportError:  # pragma: no cover - older torch
    from torch.autograd.profiler import record_function as _Range  # type: ignore[assignment]


def _tensor_shapes(values: Any) -> tuple[Any, ...]:
    """Shapes of the tensors directly inside ``values`` (torch.Size holds no tensor reference)."""
    if isinstance(values, torch.Tensor):
        return (values.shape,)
    if isinstance(values, dict):
        values = values.values()
    elif not isinstance(values, (tuple, list)):
        values = getattr(values, "values", lambda: ())()  # ModelOutput and other mappings
    return tuple(v.shape for v in values if isinstance(v, torch.Tensor))


#: Capture backends of level F: the Kineto CPU activity, or NVTX ranges recorded by CUPTI.
CAPTURE_KINETO, CAPTURE_NVTX = "kineto", "nvtx"


class FrameworkLevel:
    letter = "F"

    def __init__(self, record_shapes: bool = True, capture: str = CAPTURE_KINETO) -> None:
        self.capture = capture
        self._config = ProfilerConfig(
            ProfilerState.NVTX if capture == CAPTURE_NVTX else ProfilerState.KINETO,
            record_shapes,
            False,
            False,
            False,
            False,
            torch._C._profiler._ExperimentalConfig(),
        )
        self._activities = {ProfilerActivity.CPU} if capture == CAPTURE_KINETO else set()
        self._result: Any = None
        self._handles: list[Any] = []
        self._records = FrameworkRecords()
        self._module_index: dict[int, int] = {}
        self._paths: dict[int, str] = {}
        self._stack: list[tuple[int, int, Any]] = []  # (module index, call, open range)
        self._step_range: Any = None
        self._hook_errors = 0
        self._records_expected = False

    # -- level interface -------------------------------------------------------------------
    def enable(self) -> None:
        if torch.autograd._profiler_enabled():
            raise XspError(
                "framework level: a PyTorch profiler is already running in this process; "
                "torch.profiler and xsp's F level cannot record at the same time"
            )
        if self.capture == CAPTURE_NVTX:
            cupti.cupti_session().start(("MARKER",))
            _enable_profiler(self._config, self._activities)
        else:
            with _quiet_native_stderr():
                _prepare_profiler(self._config, self._activities)
                _enable_profiler(self._config, self._activities)
        cupti.claim_profiler(self)
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._pre_hook),
            nn_module.register_module_forward_hook(self._post_hook, always_call=True),
        ]

    def begin_iteration(self, index: int) -> None:
        self._records_expected = True
        self._step_range = _Range(f"{STEP_RANGE_PREFIX}{index}")
        self._step_range.__enter__()

    def end_iteration(self, index: int) -> None:
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None

    def disable(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        while self._stack:  # ranges left open by an exception that skipped a post hook
            self._stack.pop()[2].__exit__(None, None, None)
        if cupti.owns_profiler(self) and torch.autograd._profiler_enabled():
            with _quiet_native_stderr():
                self._result = _disable_profiler()
        if cupti.release_profiler(self) and self.capture == CAPTURE_NVTX:
            cupti.cupti_session().stop()

    def drain(self) -> FrameworkRecords:
        records, self._records = self._records, FrameworkRecords()
        result, self._result = self._result, None
        if self.capture == CAPTURE_NVTX:
            session = cupti.cupti_session()
            ranges = session.take_ranges(default_domain=True)
            session.release()
            if not len(ranges.start_ns) and self._records_expected:
                raise XspError(
                    "no NVTX range reached CUPTI: NVTX_INJECTION64_PATH must name libcupti "
                    "before PyTorch first uses NVTX (xsp run sets it)"
                )
            copy_nvtx_ranges(ranges, records)
        elif result is not None:
            _copy_events(result.events(), records)
        if self._hook_errors:
            log.warning("framework level: %d module hook calls failed", self._hook_errors)
        return records

    # -- hot path ----------------------------------------------------------------------------
    def _pre_hook(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        try:
            index = self._module_index.get(id(module))
            if index is None:
                index = self._register(module)
            calls = self._records.call_module
            call = len(calls)
            calls.append(index)
            self._records.call_input_shapes.append(_tensor_shapes(args))
            rng = _Range(f"{MODULE_RANGE_PREFIX}{call}")
            rng.__enter__()
            self._stack.append((index, call, rng))
        except Exception:  # never let tracing break the user's forward
            self._hook_failed()

    def _post_hook(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        try:
            if not self._stack:
                return
            _, call, rng = self._stack.pop()
            rng.__exit__(None, None, None)
            self._records.call_output_shapes[call] = _tensor_shapes(output)
        except Exception:
            self._hook_failed()

    def _hook_failed(self) -> None:
        self._hook_errors += 1
        if self._hook_errors == 1:
            log.exception("framework level: a module hook failed; tracing carries on")

    # -- module table (first call of each module only) -----------------------------------------
    def _register(self, module: torch.nn.Module) -> int:
        key = id(module)
        if key not in self._paths:
            if self._stack:  # called from a module whose tree does not hold it: a nested root
                parent_path = self._records.modules[self._stack[-1][0]].path
                prefix = f"{parent_path}." if parent_path else ""
                self._paths[key] = f"{prefix}<{type(module).__name__}>"
            else:  # a root: name every module below it the way named_modules() does
                for name, sub in module.named_modules(remove_duplicate=True):
                    self._paths.setdefault(id(sub), name)
        info = ModuleInfo(
            path=self._paths[key],
            type=type(module).__name__,
            params=sum(p.numel() for p in module.parameters()),
            source=_source_of(type(module)),
        )
        self._records.modules.append(info)
        self._module_index[key] = len(self._records.modules) - 1
        return self._module_index[key]


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Silence libkineto's start/stop banners (printed from C++ straight to fd 2, whatever
    KINETO_LOG_LEVEL says); Python errors still surface as exceptions."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _source_of(cls: type) -> str:
    try:
        forward = cls.forward  # type: ignore[attr-defined]
        path = inspect.getsourcefile(forward) or "?"
        line = inspect.getsourcelines(forward)[1]
        return f"{path}:{line}"
    except (TypeError, OSError, AttributeError):
        return cls.__module__


def _copy_events(events: Any, out: FrameworkRecords) -> None:
    """Copy the profiler's events into typed arrays (runs after the measured window).

    On CUDA builds the profiler's "CPU" activity also records CUDA runtime/driver calls through
    CUPTI; those belong to level L (which records them itself), so only host ops and ranges are
    kept here."""
    typed = hasattr(_KinetoEvent, "activity_type")  # torch >= 2.12; older ones: by name
    for event in events:
        if typed:
            if event.activity_type() not in HOST_ACTIVITY_TYPES:
                continue
        elif _CUDA_API_NAME.match(event.name()):
            continue
        out.name.append(event.name())
        out.start_ns.append(event.start_ns())
        out.end_ns.append(event.end_ns())
        out.thread.append(event.start_thread_id())
        out.fwd_thread.append(event.fwd_thread_id())
        out.seq_nr.append(event.sequence_nr())
        out.input_shapes.append(str(event.shapes()).replace(" ", ""))
        out.input_dtypes.append(",".join(event.dtypes()))


#: Fields PyTorch's NVTX observer appends to an op's name, in this order.
_NVTX_FIELDS = re.compile(r", (seq|op_id|sizes|input_op_ids) = ")


def parse_nvtx_name(text: str) -> tuple[str, int, str]:
    """``aten::add, seq = 7, op_id = 9, sizes = [[2, 3], []]`` -> (``aten::add``, 7,
    ``[[2,3],[]]``); a plain range name comes back with seq -1 and no shapes."""
    match = _NVTX_FIELDS.search(text)
    if match is None:
        return text, -1, "[]"
    name, seq, sizes = text[: match.start()], -1, "[]"
    parts = _NVTX_FIELDS.split(text[match.start() :])[1:]
    for key, value in zip(parts[::2], parts[1::2], strict=True):
        if key == "seq":
            seq = int(value)
        elif key == "sizes":
            sizes = value.replace(" ", "")
    return name, seq, sizes


def copy_nvtx_ranges(ranges: RangeRecords, out: FrameworkRecords) -> None:
    """PyTorch's NVTX op ranges -> framework records shaped like the Kineto capture's, which
    conversion reads: see ``link_backward_nodes``."""
    parsed: dict[int, tuple[str, int, str]] = {}
    values = ranges.name.values
    for row, code in enumerate(ranges.name.codes):
        fields = parsed.get(code)
        if fields is None:
            fields = parsed[code] = parse_nvtx_name(values[code])
        name, seq, sizes = fields
        out.name.append(name)
        out.start_ns.append(ranges.start_ns[row])
        out.end_ns.append(ranges.end_ns[row])
        out.thread.append(ranges.thread[row])
        out.fwd_thread.append(-1)
        out.seq_nr.append(seq)
        out.input_shapes.append(sizes)
        out.input_dtypes.append("")
    link_backward_nodes(out)


def link_backward_nodes(records: FrameworkRecords) -> None:
    """Give each backward node's ``evaluate_function`` range what Kineto records on it and NVTX
    names do not carry: its sequence number, which NVTX puts on the node's own range (the next
    range on the same thread, ``ConvolutionBackward0, seq = 7``), and its forward thread, the
    thread of the earliest range with that sequence number (forward runs before backward)."""
    names = records.name.values
    evaluate = np.array([n.startswith(BACKWARD_PREFIX) for n in names] or [False])
    code = np.frombuffer(records.name.codes, dtype=np.int32)
    start = np.frombuffer(records.start_ns, dtype=np.int64)
    thread = np.frombuffer(records.thread, dtype=np.int64)
    seq = np.frombuffer(records.seq_nr, dtype=np.int64)
    fwd_thread = np.frombuffer(records.fwd_thread, dtype=np.int64)
    order = np.lexsort((start, thread))
    for at in np.nonzero(evaluate[code[order]] & (seq[order] < 0))[0].tolist():
        row, node = order[at], order[min(at + 1, len(order) - 1)]
        own_name = names[code[row]][len(BACKWARD_PREFIX) :]
        if thread[node] == thread[row] and names[code[node]] == own_name:
            seq[row] = seq[node]
    by_time = np.argsort(start, kind="stable")
    with_seq = by_time[seq[by_time] >= 0]
    seqs, first = np.unique(seq[with_seq], return_index=True)
    first_thread = thread[with_seq[first]]
    backward = np.nonzero(evaluate[code] & (seq >= 0))[0]
    slot = np.searchsorted(seqs, seq[backward])
    fwd_thread[backward] = first_thread[slot]
