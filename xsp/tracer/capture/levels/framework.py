"""Level F: nn.Module (layer) spans and aten operator spans, forward and backward.

One mechanism on CPU and CUDA, alone or with L and G: xsp's native capture core
(``xsp/tracer/native/capture.cpp``).

1. A global RecordFunction callback, the hook Kineto and PyTorch's execution-trace observer use,
   writes every aten op, autograd node and ``record_function`` range (optimizer steps, DataLoader
   fetches) into the capture arena: interned name, start and end on CLOCK_REALTIME, OS thread,
   autograd sequence number and forward thread, scope, and input shapes and dtypes when asked.
   When CUPTI runs in the process it also pushes the record's id as CUPTI external correlation
   id, so each CUDA API call names its op.
2. A wrapper around ``nn.Module.__call__`` writes each module call into the same arena, with
   the shapes of its arguments and output; a module's static facts (path, type, parameters,
   source) are written once, at its first call.
3. The CPU and CUDA allocators report every allocation and free, with the total allocated, to
   a profiler state xsp puts in the thread's debug info (where torch.profiler's would go; it
   says "disabled", so torch sees no profiler); they become the run's memory events.

Nothing is turned into spans during the measured window; ``drain`` reads the arena after it,
and ``xsp.tracer.convert.framework`` nests the records. Under ``torch.compile`` the wrapper only calls
through while dynamo traces, so it adds no graph break; the compiled code's ops still reach the
callback.
"""

from __future__ import annotations

import inspect
import json
import logging
import threading
import time
from typing import Any

import torch
from torch.utils.data import DataLoader

from xsp.tracer.capture.arena import CaptureArena
from xsp.tracer.capture.inductor import KernelProvenance
from xsp.tracer.convert.arena import framework_records, open_threads
from xsp.tracer.convert.records import (
    LOADER_SETTINGS_MARK,
    STEP_RANGE_PREFIX,
    FrameworkRecords,
    loader_range_name,
)
from xsp.tracer.errors import StoreError

log = logging.getLogger(__name__)

#: How long the end of a run waits for other threads to close the ranges they have open.
OPEN_RANGE_WAIT_S = 0.2

_compiling = torch.compiler.is_compiling


class FrameworkLevel:
    letter = "F"

    def __init__(
        self,
        arena: CaptureArena,
        provenance: KernelProvenance,
        record_shapes: bool = True,
        every_iteration: bool = False,
    ) -> None:
        self._arena = arena
        self._native = arena.native
        self._stopped_on = 0  # the thread that switched the level off
        self._record_shapes = record_shapes
        # shapes cost (PyTorch boxes each op's inputs): the first measured iteration's stand for
        # the later ones that run the same ops (xsp.tracer.convert.shapes)
        self._shapes_after_first = record_shapes and not every_iteration
        self._module_call: Any = None  # nn.Module.__call__ as it was before enable()
        self._module_index: dict[int, int] = {}
        self._paths: dict[int, str] = {}
        self._module_paths: list[str] = []
        self._call_errors = 0
        self._recording = False  # between enable and disable, unless sampled off
        self._iterations = 0  # iterations recorded into the open arena
        self._paused = [False]  # read by the module-call wrapper
        self._traced_call: Any = None
        # at construction, before the program makes its loaders or compiles its models: the
        # levels may come on later
        self._loader_iter: Any = _name_loader_batches()
        self._provenance = provenance  # installed by the session, for its whole life

    @property
    def shapes_in_first_iteration_only(self) -> bool:
        """The ops' shapes are recorded in the first measured iteration and not after it."""
        return self._shapes_after_first

    def set_shapes(self, on: bool) -> None:
        """Record the ops' shapes or not from now on (the calibration times both)."""
        self._native.ops_shapes(on)

    # -- level interface -------------------------------------------------------------------
    def enable(self) -> None:
        """Come on, recording. A continuous session's batches each enable the level anew, into
        a fresh arena: the module table starts again there."""
        self._arena.open()
        self._module_index.clear()
        self._module_paths.clear()
        self._iterations = 0
        if self._loader_iter is None:
            self._loader_iter = _name_loader_batches()
        self._recording = False
        self.sample(True)

    def sample(self, on: bool) -> None:
        """Record the iterations from the next one on (``on``) or not: between iterations, for
        a continuous session's sampling policy. Off, the op callbacks and the allocators'
        reports are removed and module calls go straight to torch: an unsampled iteration pays
        nothing for this level."""
        if on == self._recording:
            return
        self._recording = on
        if on:
            self._native.ops_start(self._record_shapes)
            if self._shapes_after_first and self._iterations:  # this arena has them already
                self._native.ops_shapes(False)
            # the allocators report to the thread's profiler state: torch.profiler's, if it runs
            if not torch.autograd._profiler_enabled():
                self._native.memory_start()
            self._paused[0] = False
            if self._module_call is None:
                self._module_call = _trace_module_calls(self)
            return
        self._paused[0] = True  # a wrapper put over ours since keeps calling it: call through
        if torch.nn.Module.__call__ is self._traced_call:
            torch.nn.Module.__call__ = self._module_call  # type: ignore[method-assign]
            self._module_call = None
        self._native.memory_stop()
        self._native.ops_stop()

    def begin_iteration(self, index: int) -> None:
        if not self._recording:
            return
        self._iterations += 1
        if self._iterations == 2 and self._shapes_after_first:
            self._native.ops_shapes(False)
        self._native.range_begin(f"{STEP_RANGE_PREFIX}{index}")

    def end_iteration(self, index: int) -> None:
        if self._recording:
            self._native.range_end()

    def disable(self) -> None:
        if self._module_call is not None:
            torch.nn.Module.__call__ = self._module_call  # type: ignore[method-assign]
            self._module_call = None
        if self._loader_iter is not None:
            DataLoader.__iter__ = self._loader_iter  # type: ignore[method-assign]
            self._loader_iter = None
        self._native.modules_unwind()  # calls still open (the run ended inside a forward)
        self._stopped_on = threading.get_native_id()
        if self._recording:
            self._let_other_threads_close()
        self._recording = False
        self._native.memory_stop()
        self._native.ops_stop()

    def _let_other_threads_close(self) -> None:
        """Wait, up to ``OPEN_RANGE_WAIT_S``, for the ranges other threads still have open: a
        backend's work thread (gloo's transfer of the last bucket) ends its range just after
        the step it serves, and once the callbacks stop, a range without its end is dropped."""
        me = self._stopped_on
        deadline = time.monotonic() + OPEN_RANGE_WAIT_S
        try:
            while any(t != me for t in open_threads(self._arena.path)):
                if time.monotonic() >= deadline:
                    return  # what stays open is counted (run.json's ranges_left_open)
                time.sleep(0.005)
        except StoreError as exc:  # the arena being written is not readable: stop waiting
            log.debug("framework level: cannot look for open ranges: %s", exc)

    def counts(self) -> dict[str, Any]:
        """Ranges other threads still had open when the levels stopped (run.json): their
        records are left out. The stopping thread's own (a range around the whole loop) are not
        counted: they enclose the run's end."""
        open_threads = self._arena.contents().open_threads
        return {
            "ranges_left_open": sum(n for t, n in open_threads.items() if t != self._stopped_on)
        }

    def drain(self) -> FrameworkRecords:
        records = framework_records(self._arena.contents())
        known = list(self._paths.values())
        records.kernel_sources = self._provenance.sources(known)
        records.extern_calls = self._provenance.extern_calls(known)
        if self._call_errors:
            log.warning("framework level: %d module calls could not be recorded", self._call_errors)
        return records

    def _call_failed(self) -> None:
        self._call_errors += 1
        if self._call_errors == 1:
            log.exception("framework level: recording a module call failed; tracing carries on")

    # -- module table (first call of each module only) -----------------------------------------
    def _register(self, module: torch.nn.Module) -> int:
        key = id(module)
        if key not in self._paths:
            caller = self._native.current_module()
            if caller >= 0:  # called from a module whose tree does not hold it: a nested root
                parent_path = self._module_paths[caller]
                prefix = f"{parent_path}." if parent_path else ""
                self._paths[key] = f"{prefix}<{type(module).__name__}>"
            else:  # a root: name every module below it the way named_modules() does
                for name, sub in module.named_modules(remove_duplicate=True):
                    self._paths.setdefault(id(sub), name)
        index = len(self._module_paths)
        path = self._paths[key]
        info = {
            "path": path,
            "type": type(module).__name__,
            "params": sum(p.numel() for p in module.parameters()),
            "source": _source_of(type(module)),
        }
        self._native.module_info(index, json.dumps(info))
        self._module_paths.append(path)
        self._module_index[key] = index
        return index


def _trace_module_calls(level: FrameworkLevel) -> Any:
    """Wrap ``nn.Module.__call__`` so that each module call is written into the arena with its
    arguments' and output's shapes; returns the original to put back. Cheaper than global
    module hooks, which put every call on ``_call_impl``'s slow path (2.1 µs per call for two
    empty hooks on the dev machine, against 0.3 µs for this wrapper's frame). While dynamo
    traces a call the wrapper only calls through, so it breaks no graph."""
    original = torch.nn.Module.__call__
    indices, register = level._module_index, level._register
    enter, leave = level._native.module_enter, level._native.module_exit
    failed, paused = level._call_failed, level._paused

    def traced_call(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if paused[0] or _compiling():
            return original(module, *args, **kwargs)
        try:
            index = indices.get(id(module))  # inline: a method call per module call costs
            enter(register(module) if index is None else index, args, kwargs)
        except Exception:  # never let tracing break the user's forward
            failed()
            return original(module, *args, **kwargs)
        try:
            output = original(module, *args, **kwargs)
        except BaseException:
            leave(None)
            raise
        try:
            leave(output)
        except Exception:
            failed()
        return output

    torch.nn.Module.__call__ = traced_call  # type: ignore[method-assign]
    level._traced_call = traced_call
    return original


def _name_loader_batches() -> Any:
    """Make each DataLoader batch's profiler range name its loader's settings (``… [workers=4,
    pin_memory=True]``), which conversion turns into span attributes; returns the original
    ``DataLoader.__iter__`` to put back."""
    original = DataLoader.__iter__

    def settings_in_range_name(loader: DataLoader) -> Any:
        batches = original(loader)
        name = getattr(batches, "_profile_name", None)
        if isinstance(name, str) and LOADER_SETTINGS_MARK not in name:
            pinned = getattr(batches, "_pin_memory", loader.pin_memory)  # off without a GPU
            batches._profile_name = loader_range_name(name, loader.num_workers, bool(pinned))
        return batches

    DataLoader.__iter__ = settings_in_range_name  # type: ignore[method-assign]
    return original


_SOURCES: dict[type, str] = {}


def _source_of(cls: type) -> str:
    """``file:line`` of a module class's forward, once per class: from its code object, since
    ``inspect.getsourcelines`` tokenizes the whole function (0.1 s over ResNet-50's modules)."""
    if cls not in _SOURCES:
        try:
            code = inspect.unwrap(cls.forward).__code__  # type: ignore[attr-defined]
            source = f"{inspect.getsourcefile(code) or code.co_filename}:{code.co_firstlineno}"
        except (TypeError, OSError, AttributeError):
            source = cls.__module__
        _SOURCES[cls] = source
    return _SOURCES[cls]
