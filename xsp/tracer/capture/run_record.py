"""What a session notes down as its run goes, for run.json: when each phase began, what the
switch-on cost, where the process ran, which iterations failed and why levels came on early.

The session owns one ``RunRecord`` and writes into it at the moments it names; whoever writes
run.json (``xsp.tracer.capture.run_json``) reads it, so neither needs the other's internals.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from xsp.core.run_sections import HostState
from xsp.core.store import ProgramEnd
from xsp.tracer.capture.host_state import host_state

__all__ = ["RunRecord"]


@dataclass
class RunRecord:
    """run.json's running fields, as the session fills them in."""

    started_ns: int = field(default_factory=time.time_ns)
    #: when levels came on, measuring ended, the records were drained, converted, stored
    phases_ns: dict[str, int] = field(default_factory=dict)
    #: the switch-on's parts, in milliseconds (calibration, monitor, each level)
    switch_on_ms: dict[str, float] = field(default_factory=dict)
    #: where the process ran as it began and ended measuring (``host_state``)
    host: dict[str, HostState] = field(default_factory=dict)  # by moment
    #: measured index -> why that iteration failed
    failures: dict[int, str] = field(default_factory=dict)
    #: why the levels came on before their iteration (a CUDA graph capture), if they did
    levels_on_early: str | None = None
    #: the first level that could not start, if one did not
    level_failure: str | None = None
    #: how the traced program ended (``exit_code``, ``exception``, ``interrupted``; the leveled
    #: runner adds ``signal`` for a killed process)
    program: ProgramEnd | None = None

    def mark(self, phase: str) -> int:
        """``phase`` begins now; returns now (ns)."""
        self.phases_ns[phase] = now = time.time_ns()
        return now

    def note_host(self, moment: str) -> None:
        """Where the process runs at ``moment`` ("measuring", "measured")."""
        self.host[moment] = host_state()
