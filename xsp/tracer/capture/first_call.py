"""The next ``nn.Module`` call, caught once: the root module of a program's first forward pass
(a model's call comes before its children's). The root-module fixes find their model there
(``xsp.tracer.workloads.fixes``), and the automatic iterations finish a run at the first call
after its last one (``xsp.tracer.capture.iterations``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)


class NextModuleCall:
    """Calls ``callback(module)`` once, just before the next nn.Module call, by wrapping
    ``nn.Module.__call__`` (outside level F's own wrapper, so that the call is recorded inside
    the iteration the callback begins), then unwraps itself. ``remove`` unwraps it if the
    wrapper is still in place; one wrapped over since only calls through."""

    def __init__(
        self, callback: Callable[[Any], None], accept: Callable[[Any], bool] | None = None
    ) -> None:
        self._module = torch.nn.Module
        inner = torch.nn.Module.__call__
        pending = [callback]

        def next_call(module: Any, *args: Any, **kwargs: Any) -> Any:
            if accept is not None and not _accepts(accept, module):
                return inner(module, *args, **kwargs)  # not the one: wait for the next call
            self.remove()
            if pending:
                try:
                    pending.pop()(module)
                except Exception:  # never into the program's forward pass
                    log.exception("xsp: the work at the first module call failed")
            return inner(module, *args, **kwargs)

        self._inner, self._wrapper = inner, next_call
        self._module.__call__ = next_call  # type: ignore[method-assign]

    def remove(self) -> None:
        if self._module.__call__ is self._wrapper:
            self._module.__call__ = self._inner  # type: ignore[method-assign]


def _accepts(accept: Callable[[Any], bool], module: Any) -> bool:
    try:
        return bool(accept(module))
    except Exception:
        return False
