"""How a session finds its iterations: explicit markers (``xsp.step()``, ``xsp.iteration()``),
a named function's calls, or an unmodified script's optimizer steps or root-module calls
(``xsp.tracer.capture.iterations``); an explicit marker switches the automatic ones off."""

from __future__ import annotations

import logging

from xsp.tracer.capture import iterations as boundaries

__all__ = ["IterationMarkers"]

log = logging.getLogger(__name__)


class IterationMarkers:
    """The automatic boundary a session watches, if any, and whether it was marked itself."""

    def __init__(self, auto: bool) -> None:
        self.auto = auto  # find an unmodified script's iterations
        self.watch: boundaries.ModelCalls | boundaries.FunctionCalls | None = None
        self.marked = False  # xsp.step() or xsp.iteration() was called

    def watch_function(self, name: str, session: boundaries.Iterations) -> None:
        """Each call of the function ``name`` is one iteration (ConfigError when it cannot be
        found)."""
        self.watch = boundaries.FunctionCalls(name, session)

    def watch_model(self, session: boundaries.Iterations) -> None:
        """Find an unmodified script's iterations, unless a named function's calls are them."""
        if self.auto and self.watch is None:
            self.watch = boundaries.ModelCalls(session)

    def settle(self) -> None:
        """The session closes: a root-module call still undecided ends as one."""
        if isinstance(self.watch, boundaries.ModelCalls):
            self.watch.settle()

    def explicit(self) -> None:
        """An explicit marker was called: the automatic boundaries are off from now on."""
        if self.marked:
            return
        self.marked = True
        if self.watch is not None:
            self.watch.remove()
            self.watch = None
            log.info("xsp: explicit iteration markers found; automatic boundaries are off")

    def remove(self) -> None:
        """The run is over: no more iterations to find."""
        if self.watch is not None:
            self.watch.remove()

    def boundary(self, index: int) -> str | None:
        """What ended the run's iterations (``index`` of them so far), None while nothing
        has."""
        if self.marked:
            return boundaries.MARKED
        if self.watch is not None and self.watch.boundary is not None:
            return self.watch.boundary
        if isinstance(self.watch, boundaries.ModelCalls) and index:
            return boundaries.ROOT_MODULE_CALL  # undecided: the warm-up's were root calls
        return None

    def why_none(self, index: int, warmup: int) -> str:
        """Why a run that ended ``index`` iterations measured none, in words a user can act
        on."""
        if index > 0:
            return (
                f"the program ran {index} iteration(s) ({self.boundary(index)}), "
                f"all of them warm-up (--warmup {warmup})"
            )
        if isinstance(self.watch, boundaries.FunctionCalls):
            return (
                f"{self.watch.boundary.removeprefix(boundaries.FUNCTION_PREFIX)} was never called"
            )
        if self.auto and not self.marked:
            return (
                "the program called no nn.Module with parameters and no optimizer.step(); mark "
                "its iterations with xsp.step() or name a function with --iteration-fn"
            )
        return "no iteration was marked"
