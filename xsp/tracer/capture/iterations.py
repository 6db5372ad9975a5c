"""How the iterations of an unmodified script are found: the session's automatic boundaries.

A boundary begins and ends the session's iterations; ``run.json`` says which one a run used
(``iteration_boundary``)::

    marked             xsp.step() / xsp.iteration() in the program: they switch the others off
    function:<name>    --iteration-fn: each outermost call of the named function (a whole
                       request, e.g. transformers.GenerationMixin.generate)
    optimizer-step     training: an iteration runs from one optimizer step to the next (the first
                       from the root module's first call), as Nsight's and torch.profiler's step
                       ranges do, so data loading and the syncs between steps fall inside it
    root-module-call   inference: each call of the root module is one iteration (a forward pass;
                       under transformers' generate(), one decoding step)

Without --iteration-fn the last two are watched together. The root module is the first module
with parameters called outside any other module call (a loss or a transform called first is
not it). During the warm-up, iterations end when the root module returns until an optimizer step
is seen: from the first one on, optimizer steps are the boundary. The first measured iteration
fixes the choice: root-module calls if no optimizer step came during the warm-up (an optimizer
step later is noted in ``run.json``: a training loop that accumulates gradients over more forward
passes than the warm-up has needs a longer warm-up or markers). With no warm-up at all, a first
call under ``torch.no_grad()`` (or inference mode) is taken as inference at once; otherwise the
first iteration ends at the next optimizer step, or at the root module's next call.

Hot path: after the root is found, only calls of modules of the root's class go through one
extra Python frame (the class gets its own ``__call__``); every other module call pays nothing.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from collections.abc import Callable
from typing import Any, Protocol

from xsp.core.errors import ConfigError

__all__ = [
    "FUNCTION_PREFIX",
    "MARKED",
    "MARKER_FAILED",
    "OPTIMIZER_STEP",
    "ROOT_MODULE_CALL",
    "FunctionCalls",
    "Iterations",
    "ModelCalls",
    "RootFinder",
    "check_name",
    "has_parameters",
]

log = logging.getLogger(__name__)

MARKED = "marked"
OPTIMIZER_STEP = "optimizer-step"
ROOT_MODULE_CALL = "root-module-call"
FUNCTION_PREFIX = "function:"


class Iterations(Protocol):
    """What a boundary drives: the session's iteration markers."""

    @property
    def measuring(self) -> bool: ...

    @property
    def is_open(self) -> bool: ...

    def begin_iteration(self) -> None: ...

    def end_iteration(self, error: str | None = None, finish: bool = False) -> None: ...

    @property
    def done(self) -> bool: ...

    def finish_if_done(self) -> None: ...

    def note(self, what: str) -> None: ...

    def boundary_changed(self) -> None: ...

    def lease_to(self, lessee: Callable[[int, int, int, Any], None]) -> None: ...

    def settle_leased(self, done: int, errors: list[tuple[int, str]]) -> None: ...


class FunctionCalls:
    """Each outermost call of the function named ``MODULE.QUALNAME`` is one iteration: the
    attribute is replaced by a wrapper (before the program runs, so that ``from m import f``
    gets it too) and put back by ``remove``."""

    def __init__(self, name: str, session: Iterations) -> None:
        self.boundary = FUNCTION_PREFIX + name
        self._owner, self._attribute, self._original = _resolve(name)
        function = self._original
        kind: Callable[[Any], Any] | None = None
        if isinstance(function, (staticmethod, classmethod)):
            kind, function = type(function), function.__func__
        if not callable(function):
            raise ConfigError(
                f"bad --iteration-fn {name!r}: {type(function).__name__} is not callable"
            )
        inside = [False]

        @functools.wraps(function)
        def iteration(*args: Any, **kwargs: Any) -> Any:
            if inside[0]:  # a call from within the iteration (recursion): part of it
                return function(*args, **kwargs)
            inside[0] = True
            try:
                _safely(session, "begin", session.begin_iteration)
                try:
                    result = function(*args, **kwargs)
                except BaseException as exc:
                    _safely(session, "end", session.end_iteration, _error(exc))
                    raise
                _safely(session, "end", session.end_iteration)
                _safely(session, "finish", session.finish_if_done)
                return result
            finally:
                inside[0] = False

        setattr(self._owner, self._attribute, kind(iteration) if kind else iteration)
        self._wrapper = inspect.getattr_static(self._owner, self._attribute)

    def remove(self) -> None:
        if inspect.getattr_static(self._owner, self._attribute, None) is self._wrapper:
            setattr(self._owner, self._attribute, self._original)


def check_name(name: str) -> list[str]:
    """The dotted parts of a ``MODULE.QUALNAME``; ConfigError for anything else (nothing is
    imported: the runner checks the name before the program runs)."""
    parts = name.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ConfigError(
            f"bad --iteration-fn {name!r}: give MODULE.QUALNAME, e.g. "
            "transformers.GenerationMixin.generate"
        )
    return parts


def _resolve(name: str) -> tuple[Any, str, Any]:
    """(owner, attribute, its value) of ``MODULE.QUALNAME``: the longest importable prefix is
    the module, the rest attributes; ConfigError naming what is missing."""
    parts = check_name(name)
    for split in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for i, part in enumerate(parts[split:], start=split):
            if not hasattr(owner, part):
                where = ".".join(parts[:i])
                raise ConfigError(f"bad --iteration-fn {name!r}: {where} has no attribute {part!r}")
            if i < len(parts) - 1:
                owner = getattr(owner, part)
        return owner, parts[-1], inspect.getattr_static(owner, parts[-1])
    raise ConfigError(f"bad --iteration-fn {name!r}: no module of it can be imported")


class ModelCalls:
    """The optimizer-step and root-module-call boundaries, watched together (module docs)."""

    def __init__(self, session: Iterations) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._session = session
        self.boundary: str | None = None  # decided: OPTIMIZER_STEP or ROOT_MODULE_CALL
        self._warmup_calls = 0  # root calls that ended warm-up iterations
        self._first_returned = False  # no warm-up: the root's first call is over, undecided
        self._grad = True  # grad mode at the open iteration's root call
        self._late_step_noted = False
        self._root_calls: _RootCalls | None = None
        self._after_last: _NextModuleCall | None = None
        self._hooks: list[Any] = [register_optimizer_step_post_hook(self._optimizer_step)]
        self._finder: RootFinder | None = RootFinder(self._root_found)

    def remove(self) -> None:
        for hook in [*self._hooks, self._finder, self._root_calls, self._after_last]:
            if hook is not None:
                hook.remove()
        self._hooks, self._finder, self._root_calls, self._after_last = [], None, None, None

    def settle(self) -> None:
        """At the close: the root call's leased iterations are counted, and a first iteration
        still undecided ended when the root returned (the program called its model once,
        without an optimizer step)."""
        if self._root_calls is not None:
            self._root_calls.settle()
        if self.boundary is None and self._first_returned and self._session.is_open:
            self._decide(ROOT_MODULE_CALL)
            self._session.end_iteration()

    # -- root-module calls ------------------------------------------------------------------------
    def _root_found(self, root: Any) -> None:
        self._finder = None
        if self.boundary != OPTIMIZER_STEP:
            self._root_calls = _RootCalls(
                root, self._root_begins, self._root_ends, self._session.settle_leased
            )

    def _root_begins(self) -> None:
        session = self._session
        if self.boundary is None and session.is_open:
            # no warm-up: the first iteration is still open after the root's first call, and
            # no optimizer step came before this second call
            self._decide(ROOT_MODULE_CALL)
            session.end_iteration()
            session.finish_if_done()
        elif self.boundary is None and session.measuring and self._warmup_calls:
            self._decide(ROOT_MODULE_CALL)  # the warm-up saw no optimizer step
        if not session.is_open:
            self._grad = _grad_enabled()
            session.begin_iteration()

    def _root_ends(self, error: str | None) -> None:
        session = self._session
        if self.boundary is None:
            if session.measuring and self._grad:
                self._first_returned = error is None
                return  # no warm-up: the next optimizer step or root call decides
            if session.measuring:
                self._decide(ROOT_MODULE_CALL)  # no backward can follow a no-grad forward
            self._warmup_calls += 1
        elif self.boundary != ROOT_MODULE_CALL:
            return
        session.end_iteration(error)
        session.finish_if_done()

    # -- optimizer steps --------------------------------------------------------------------------
    def _optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """An optimizer step ends the iteration and begins the next one. After the last one
        the levels stay on until the next module call (or the close): this hook runs inside the
        optimizer's own range, which would otherwise be cut short."""
        try:
            if self.boundary is None:
                self._decide(OPTIMIZER_STEP)
            if self.boundary == ROOT_MODULE_CALL:
                self._note_late_step()
                return
            session = self._session
            session.end_iteration()
            if session.done:
                self._after_last = _NextModuleCall(self._finish_at_next_call)
                return
            session.begin_iteration()
        except Exception:
            self._session.note("automatic iteration end failed")

    def _finish_at_next_call(self) -> None:
        self.remove()  # the run is over: no more iterations to detect
        self._session.finish_if_done()

    def _decide(self, boundary: str) -> None:
        self.boundary = boundary
        if boundary == ROOT_MODULE_CALL and self._root_calls is not None:
            # from now on a root call only begins and ends an iteration (a service's every
            # request: no decision left to make in between)
            session = self._session
            self._root_calls.use(
                session.begin_iteration, functools.partial(session.end_iteration, finish=True)
            )
            session.lease_to(self._root_calls.lease)
        if boundary == OPTIMIZER_STEP:
            for hook in (self._root_calls, self._finder):
                if hook is not None:
                    hook.remove()
            self._root_calls = self._finder = None
            self._session.boundary_changed()
        log.info("xsp: iterations are %ss", boundary)

    def _note_late_step(self) -> None:
        if not self._late_step_noted:
            self._late_step_noted = True
            self._session.note(
                "an optimizer step came after the iterations were taken as root-module calls "
                "(no optimizer step during the warm-up): for a training loop that accumulates "
                "gradients, raise --warmup past its forward passes or mark it with xsp.step()"
            )


def _safely(session: Iterations, what: str, action: Callable[..., None], *args: Any) -> None:
    """Tracing never breaks the traced program: a failing marker is noted."""
    try:
        action(*args)
    except Exception:
        session.note(f"automatic iteration {what} failed")


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class RootFinder:
    """Wraps ``nn.Module.__call__`` until the root module is called: the first module with
    parameters called outside any other module call. Calls ``found(root)``, unwraps itself and
    sends that call on through the root's own class (where ``found`` may have put a wrapper).
    One wrapped over since (level F) only calls through."""

    def __init__(self, found: Callable[[Any], None]) -> None:
        import torch

        self._module = torch.nn.Module
        inner = torch.nn.Module.__call__
        depth = [0]
        pending = [found]

        def find_root(module: Any, *args: Any, **kwargs: Any) -> Any:
            if pending and depth[0] == 0 and has_parameters(module):
                self.remove()
                _guarded(pending.pop(), module)
                return module(*args, **kwargs)
            depth[0] += 1
            try:
                return inner(module, *args, **kwargs)
            finally:
                depth[0] -= 1

        self._inner, self._wrapper = inner, find_root
        self._module.__call__ = find_root  # type: ignore[method-assign]

    def remove(self) -> None:
        if self._module.__call__ is self._wrapper:
            self._module.__call__ = self._inner  # type: ignore[method-assign]


def _grad_enabled() -> bool:
    import torch

    return bool(torch.is_grad_enabled())


def has_parameters(module: Any) -> bool:
    """A model, not a transform or a loss: the root the iterations and the fixes look for."""
    try:
        return next(iter(module.parameters()), None) is not None
    except Exception:
        return False


class _RootCalls:
    """Calls ``begins()`` before and ``ends(error)`` after each call of ``root`` that is not
    inside another call of it, through a ``__call__`` of the root's class (outside level F's
    wrapper of ``nn.Module.__call__``, so the root's own span falls inside the iteration).
    Other instances of the class only call through; ``remove`` puts the class back. ``use``
    swaps the two callbacks (once the boundary is decided, the session's own markers).

    The ``__call__`` is the native core's ``RootCall`` (capture.cpp): a service's every request
    passes it. ``lease`` hands it the session's next iterations that record level M's step and
    nothing else; it times and records those itself, without a Python frame of xsp's, and calls
    ``settle(done, errors)`` before the next marker (``settle()`` here at the session's close)."""

    def __init__(
        self,
        root: Any,
        begins: Callable[[], None],
        ends: Callable[[str | None], None],
        settle: Callable[[int, list[tuple[int, str]]], None],
    ):
        from xsp.tracer.native.build import load

        cls = type(root)
        self._cls, self._own = cls, cls.__dict__.get("__call__")
        self._wrapper = load().RootCall(root, cls, self._own, begins, ends, _report, settle)
        cls.__call__ = self._wrapper

    def use(self, begins: Callable[[], None], ends: Callable[[str | None], None]) -> None:
        self._wrapper.use(begins, ends)

    def lease(self, next_index: int, count: int, deadline_ns: int, sync: Any) -> None:
        self._wrapper.lease(next_index, count, deadline_ns, sync)

    def settle(self) -> None:
        self._wrapper.settle()

    def remove(self) -> None:
        self.settle()
        if self._cls.__dict__.get("__call__") is not self._wrapper:
            return
        if self._own is not None:
            self._cls.__call__ = self._own
        else:
            del self._cls.__call__


def _report(exc: BaseException) -> None:
    log.error(MARKER_FAILED, exc_info=exc)


MARKER_FAILED = "xsp: automatic iteration marker failed"


def _guarded(action: Callable[..., None], *args: Any) -> None:
    """Tracing never breaks the traced program's forward."""
    try:
        action(*args)
    except Exception:
        log.exception(MARKER_FAILED)


class _NextModuleCall:
    """Calls ``callback()`` once, just before the next nn.Module call, by wrapping
    ``nn.Module.__call__``, then unwraps itself. ``remove`` unwraps it if the wrapper is still
    in place; one wrapped over since only calls through."""

    def __init__(self, callback: Callable[[], None]) -> None:
        import torch

        self._module = torch.nn.Module
        inner = torch.nn.Module.__call__
        pending = [callback]

        def next_call(module: Any, *args: Any, **kwargs: Any) -> Any:
            self.remove()
            if pending:
                _guarded(pending.pop())
            return inner(module, *args, **kwargs)

        self._inner, self._wrapper = inner, next_call
        self._module.__call__ = next_call  # type: ignore[method-assign]

    def remove(self) -> None:
        if self._module.__call__ is self._wrapper:
            self._module.__call__ = self._inner  # type: ignore[method-assign]
