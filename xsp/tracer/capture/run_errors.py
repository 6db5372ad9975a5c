"""The failures a session records instead of raising into the traced program: run.json's
``errors``, one line each."""

from __future__ import annotations

import logging
from collections.abc import Iterable

__all__ = ["RunErrors"]

log = logging.getLogger(__name__)


class RunErrors:
    """run.json's ``errors``; ``misuse`` also warns, once per session (a service's markers may
    go wrong thousands of times a second)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._warned = False

    def add(self, message: str) -> None:
        self.lines.append(message)

    def extend(self, messages: Iterable[str]) -> None:
        self.lines.extend(messages)

    def misuse(self, what: str) -> None:
        self.lines.append(what)
        if not self._warned:
            self._warned = True
            log.warning("xsp: %s (logged once; tracing carries on)", what)
