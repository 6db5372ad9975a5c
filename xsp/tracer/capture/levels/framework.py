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
   source) are written once, at its first call. It is put in place once, when the level first
   comes on, and a flag switches it (``_ModuleCalls``): a continuous session's sampling switches
   it per request, and reassigning ``nn.Module.__call__`` (a type slot) costs 23 µs, as Python
   updates every module class below it.
3. The CPU and CUDA allocators report every allocation and free, with the total allocated, to
   a profiler state xsp puts in the thread's debug info (where torch.profiler's would go; it
   says "disabled", so torch sees no profiler); they become the run's memory events. While the
   program's own torch.profiler runs, xsp's state leaves that slot (``xsp.tracer.capture.hooks.coexist``).

Nothing is turned into spans during the measured window; ``drain`` reads the arena after it,
and ``xsp.tracer.convert.framework`` nests the records. Under ``torch.compile`` the wrapper only calls
through while dynamo traces, so it adds no graph break; the compiled code's ops still reach the
callback.
"""

from __future__ import annotations

import importlib.abc
import inspect
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from xsp.core.arena import ArenaContents, framework_records, open_threads
from xsp.core.errors import StoreError
from xsp.core.records import (
    LOADER_SETTINGS_MARK,
    STEP_RANGE_PREFIX,
    FrameworkRecords,
    loader_range_name,
)
from xsp.core.run_sections import RunCounts
from xsp.tracer.capture.hooks.arena import CaptureArena
from xsp.tracer.capture.hooks.coexist import MEMORY, program_profiler
from xsp.tracer.capture.hooks.inductor import KernelProvenance

if TYPE_CHECKING:
    from xsp.tracer.capture.levels import LevelContext
    from xsp.tracer.export.batches import BatchDrain

__all__ = ["OPEN_RANGE_WAIT_S", "FrameworkLevel", "build"]

log = logging.getLogger(__name__)

#: How long the end of a run waits for other threads to close the ranges they have open.
OPEN_RANGE_WAIT_S = 0.2

_compiling = torch.compiler.is_compiling
#: Imported once a program compiles: until then no module call can be inside dynamo's trace.
_DYNAMO = "torch._dynamo"


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
        self._module_calls: _ModuleCalls | None = None  # from the first enable() on
        self._module_index: dict[int, int] = {}
        self._paths: dict[int, str] = {}
        self._module_paths: list[str] = []
        self._call_errors = 0
        self._recording = False  # between enable and disable, unless sampled off
        self._iterations = 0  # iterations recorded into the open arena
        # at construction, before the program makes its loaders or compiles its models: the
        # levels may come on later
        self._loader_iter: Any = _name_loader_batches()
        self._provenance = provenance  # installed by the session, for its whole life
        #: switched off and on between the measured iterations (``switched_per_iteration``)
        self._per_iteration = False

    def switched_per_iteration(self) -> None:
        """This level will be switched off and on between measured iterations (an untraced
        iteration before each traced one, ``xsp.tracer.capture.interleave``): before it
        comes on, so that its module wrapper lets a torch.compile trace through before it
        reads its switch, and switching it compiles nothing again."""
        self._per_iteration = True

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
        program_profiler().run_begins()
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
            self._memory_on()
            if self._module_calls is None:
                self._module_calls = _ModuleCalls(self)
            self._module_calls.recording(True)
            return
        if self._module_calls is not None:
            self._module_calls.recording(False)
        self._memory_off()
        self._native.ops_stop()

    def _memory_on(self) -> None:
        """The allocators report to the thread's profiler state: xsp's, unless the program's
        torch.profiler runs (its state is there then, and xsp's would break it:
        ``xsp.tracer.capture.hooks.coexist``); xsp's leaves while it runs and comes back after."""
        held = program_profiler().listen(MEMORY, self._native.memory_stop, self._memory_back)
        if not held and not torch.autograd._profiler_enabled():
            self._native.memory_start()

    def _memory_back(self) -> None:
        if self._recording and not torch.autograd._profiler_enabled():
            self._native.memory_start()

    def _memory_off(self) -> None:
        program_profiler().forget(MEMORY)
        self._native.memory_stop()

    def begin_iteration(self, index: int) -> None:
        if not self._recording:
            return
        program_profiler().begin_iteration(MEMORY, index)
        self._iterations += 1
        if self._iterations == 2 and self._shapes_after_first:
            self._native.ops_shapes(False)
        self._native.range_begin(f"{STEP_RANGE_PREFIX}{index}")

    def end_iteration(self, index: int) -> None:
        if self._recording:
            self._native.range_end()
            program_profiler().end_iteration(MEMORY, index)

    def handover(self) -> BatchDrain:
        """A continuous session's batch boundary, between iterations on the program's thread:
        stop recording into the arena, which the session recycles next (``enable`` follows),
        with module calls still wrapped. Cheap: returns the drain of this batch's records, which
        the session's exporter runs on its own thread over the batch's arena
        (``xsp.tracer.export.batches``)."""
        self._stop_recording()
        return self._batch_drain()

    def disable(self) -> None:
        self._stop_recording()
        if self._module_calls is not None:
            self._module_calls.remove()
            self._module_calls = None
        if self._loader_iter is not None:
            DataLoader.__iter__ = self._loader_iter  # type: ignore[method-assign]
            self._loader_iter = None

    def _stop_recording(self) -> None:
        if self._module_calls is not None:
            self._module_calls.recording(False)
        self._native.modules_unwind()  # calls still open (the run ended inside a forward)
        self._stopped_on = threading.get_native_id()
        if self._recording:
            self._let_other_threads_close()
        self._recording = False
        self._memory_off()
        self._native.ops_stop()

    def _batch_drain(self) -> BatchDrain:
        """The drain of the records in the arena now: what it needs of this level's state is
        taken here (the module paths, inductor's kernel definitions), since the next batch
        goes on changing it."""
        known = list(self._paths.values())
        provenance = self._provenance.snapshot()
        stopped_on = self._stopped_on

        def drain(contents: ArenaContents) -> tuple[FrameworkRecords, RunCounts]:
            records = framework_records(contents)
            records.kernel_sources = provenance.sources(known)
            records.extern_calls = provenance.extern_calls(known)
            return records, {"ranges_left_open": _left_open(contents, stopped_on)}

        return drain

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

    def counts(self) -> RunCounts:
        """Ranges other threads still had open when the levels stopped (run.json): their
        records are left out. The stopping thread's own (a range around the whole loop) are not
        counted: they enclose the run's end."""
        counts: RunCounts = {
            "ranges_left_open": _left_open(self._arena.contents(), self._stopped_on)
        }
        if program := program_profiler().summary():
            counts["program_profiler"] = program
        return counts

    def drain(self) -> FrameworkRecords:
        records, _ = self._batch_drain()(self._arena.contents())
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


def _left_open(contents: ArenaContents, stopped_on: int) -> int:
    return sum(n for t, n in contents.open_threads.items() if t != stopped_on)


class _ModuleCalls:
    """``nn.Module.__call__`` wrapped so that each module call is written into the arena with
    its arguments' and output's shapes, while ``recording``; put back by ``remove``.

    Switched by a flag, not by reassigning ``nn.Module.__call__``: that is a type slot, so
    Python updates every module class below it (23 µs each way on the dev machine, then a
    slower first request), where a sampled service switches per request. Switched off, the
    wrapper is torch's own ``Module.__call__`` (``_wrapped_call_impl``), inlined behind one
    test of the flag: an unsampled request runs as many Python frames as an untraced one.
    Where ``Module.__call__`` is not torch's as known here (another torch, another wrapper),
    it calls through to it. Cheaper than global module hooks, which put every call on
    ``_call_impl``'s slow path (2.1 µs per call for two empty hooks on the dev machine,
    against 0.3 µs for this wrapper's frame), and which cannot see keyword arguments before
    the call. While dynamo traces a call the wrapper only calls through, so it breaks no graph;
    in a level switched between measured iterations it does so before it reads its switch
    (once the program has imported dynamo), so that switching it recompiles nothing."""

    def __init__(self, level: FrameworkLevel) -> None:
        original = torch.nn.Module.__call__
        # torch's: `if self._compiled_call_impl is not None: ... else: self._call_impl(...)`
        inline = original is torch.nn.Module._wrapped_call_impl and original.__code__.co_names == (
            "_compiled_call_impl",
            "_call_impl",
        )
        indices, register = level._module_index, level._register
        enter, leave = level._native.module_enter, level._native.module_exit
        failed = level._call_failed
        on = False
        # a level switched between measured iterations, in a program that may compile
        watched = level._per_iteration
        dynamo = watched and _DYNAMO in sys.modules

        def module_call(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            # dynamo guards on what its trace reads: a guard on the switch made every compiled
            # graph compile (or load) again, with its kernels' provenance twice, when F came on
            # or off between an untraced and a traced iteration. So there, once the program may
            # compile (dynamo imported), a trace passes through before the switch is read. A
            # service's unsampled request makes no call for it (two Python calls a module)
            if dynamo and _compiling():
                return original(module, *args, **kwargs)
            if not on:  # a service's unsampled request passes here: torch's own, inline
                if not inline:
                    return original(module, *args, **kwargs)
                if module._compiled_call_impl is not None:
                    return module._compiled_call_impl(*args, **kwargs)
                return module._call_impl(*args, **kwargs)
            if _compiling():
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

        def recording(value: bool) -> None:
            nonlocal on
            on = value

        def dynamo_imported() -> None:  # before dynamo can trace a call of it
            nonlocal dynamo
            dynamo = True

        self.recording = recording
        self._original, self._wrapper = original, module_call
        self._watch: _OnImport | None = None
        if watched and not dynamo:
            self._watch = _OnImport(_DYNAMO, dynamo_imported)
            sys.meta_path.insert(0, self._watch)
        torch.nn.Module.__call__ = module_call  # type: ignore[method-assign]

    def remove(self) -> None:
        """Put torch's back; a wrapper put over ours since keeps calling ours, switched off."""
        self.recording(False)
        if self._watch is not None and self._watch in sys.meta_path:
            sys.meta_path.remove(self._watch)
        if torch.nn.Module.__call__ is self._wrapper:
            torch.nn.Module.__call__ = self._original  # type: ignore[method-assign]


class _OnImport(importlib.abc.MetaPathFinder):
    """Calls ``then`` when the module ``name`` is first imported (it finds nothing itself)."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self._name, self._then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == self._name:
            self._then()
        return None


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


def build(ctx: LevelContext) -> FrameworkLevel:
    """Level F of a session (its row in ``xsp.core.levels`` names this factory)."""
    from xsp.core import config

    # a multi-rank job's collective sizes come from each iteration's own shapes
    every = ctx.multi_rank or config.op_shape_iterations() == "every"
    return FrameworkLevel(
        ctx.arena, ctx.provenance, record_shapes=ctx.op_shapes, every_iteration=every
    )
