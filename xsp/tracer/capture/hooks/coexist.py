"""Sharing the process with the program's own ``torch.profiler``.

Many training scripts run ``torch.profiler.profile`` with a schedule, or start one from a
callback. Two things of xsp's would meet it:

- **The thread's profiler state.** Level F's allocator reports go to a profiler state xsp puts
  in the thread's debug info (``ThreadLocalDebugInfo``, kind ``PROFILER_STATE``), the slot
  torch.profiler's own state takes. torch.profiler refuses to start while that slot holds any
  state (``enableProfiler``: "Profiler is already enabled on this thread"), its stop pops
  whatever state is on top ("Can't disable Kineto profiler…"), and its op callbacks cast the
  state on top to its own. So while the program's profiler runs (its ``_enable_profiler`` to its
  ``_disable_profiler``), xsp's state leaves the slot: level F records its ops and layers as
  ever, but no memory events.
- **CUPTI** (levels L and G on CUDA). A profiler with device activities takes CUPTI from its
  warm-up on (``_prepare_profiler``): the buffer callbacks (the last registration wins in the
  process), its activity kinds, and the one callback subscriber, which Kineto takes once and
  never retries. Where the installed torch shares no CUPTI subscription, xsp steps its CUPTI
  aside from the program's ``_prepare_profiler`` to its ``_disable_profiler`` (its records so far
  are kept) and starts it again after: levels L and G have no spans in the iterations between.

The program's profiler is seen through ``torch.autograd.profiler``'s ``_prepare_profiler``,
``_enable_profiler`` and ``_disable_profiler``, which ``torch.profiler.profile`` and
``torch.autograd.profiler.profile`` call: xsp wraps them once a level that needs it comes on,
and the wrappers call torch's, unchanged, in between. The iterations in which xsp stepped aside
are counted; run.json's ``program_profiler`` says which and why in one line, which becomes a
status reason (status partial) when spans are missing (L, G).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from xsp.core.run_sections import ProgramProfilerSummary

__all__ = ["ProgramProfiler", "StepAside", "plan", "program_profiler", "reason", "shared_cupti"]

log = logging.getLogger(__name__)

#: The part of xsp that steps aside: F's memory events, L's and G's CUPTI records.
MEMORY, CUPTI = "memory", "cupti"

#: The functions of ``torch.autograd.profiler`` the program's profiler goes through.
_WRAPPED = ("_prepare_profiler", "_enable_profiler", "_disable_profiler")


@dataclass(frozen=True)
class StepAside:
    """What xsp steps aside while the program's profiler runs."""

    memory: bool  # F's allocator reports leave the thread's profiler state
    cupti: bool  # L's and G's CUPTI activity stops (no shared subscription)


def plan(
    activities: Collection[str], memory_on: bool, cupti_on: bool, shared_cupti: bool
) -> StepAside:
    """What xsp must step aside for a program's profiler of ``activities`` (``"CPU"``,
    ``"CUDA"``, …; empty when unknown, as for a profiler started before xsp could see it):
    F's memory events whenever F records them (the profiler's state takes the thread's slot,
    whatever its activities); CUPTI when L or G runs it and the profiler records a device,
    unless torch shares its CUPTI subscription."""
    device = not activities or any(a != "CPU" for a in activities)
    return StepAside(memory=memory_on, cupti=cupti_on and device and not shared_cupti)


def reason(
    memory_iterations: Iterable[int],
    cupti_iterations: Iterable[int],
    cupti_letters: str,
    shared_cupti_missing: str,
) -> tuple[str | None, bool]:
    """The one line that says what xsp could not record while the program's profiler ran, and
    whether spans are missing (levels L and G): (None, False) when nothing was."""
    memory, cupti = sorted(set(memory_iterations)), sorted(set(cupti_iterations))
    if not memory and not cupti:
        return None, False
    parts = []
    if cupti:
        levels = " and ".join(cupti_letters) or "L and G"
        parts.append(
            f"held CUPTI in {_iterations(cupti)}: level{'s' if len(cupti_letters) > 1 else ''} "
            f"{levels} stepped aside and have no spans there ({shared_cupti_missing})"
        )
    if memory:
        parts.append(
            f"held the thread's profiler state in {_iterations(memory)}: level F's memory "
            "events are missing there (its ops and layers are recorded)"
        )
    return "the program's torch.profiler " + "; it ".join(parts), bool(cupti)


def _iterations(indices: list[int]) -> str:
    shown = ", ".join(str(i) for i in indices[:8]) + (", …" if len(indices) > 8 else "")
    return f"{len(indices)} measured iteration{'s' if len(indices) != 1 else ''} ({shown})"


def _activity_names(activities: Any) -> list[str]:
    names = []
    for activity in activities or ():
        name = getattr(activity, "name", None) or str(activity).rsplit(".", 1)[-1]
        names.append(str(name).upper())
    return names


def shared_cupti() -> str | None:
    """None where the installed torch shares its CUPTI subscription with other clients (a
    subscriber-callback registry, pytorch#191944), else why not, in words for the status line.
    xsp does not use such a registry yet: it steps aside everywhere."""
    import torch

    return f"PyTorch {torch.__version__.split('+')[0]}: xsp shares no CUPTI subscription with it"


class ProgramProfiler:
    """Watches the program's ``torch.profiler`` and steps xsp's parts aside while it runs."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._installed = False
        self._originals: dict[str, Any] = {}  # open: torch.profiler's attributes replaced, by name
        self._listeners: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {}
        self._aside: set[str] = set()
        self._activities: list[str] = []
        self._running = False  # between the program's prepare (or enable) and its disable
        self._enabled = False  # between its enable and its disable: its state is in the slot
        self._holds = 0  # how many times the program's profiler has started
        self.iterations: dict[str, set[int]] = {MEMORY: set(), CUPTI: set()}
        self._began: dict[str, tuple[bool, int]] = {}
        self._asides = {MEMORY: 0, CUPTI: 0}  # how many times each part stepped aside
        self.errors: list[str] = []
        self.cupti_letters: set[str] = set()  # the levels that record through CUPTI
        self._said = False

    def run_begins(self) -> None:
        """A session's levels come on: forget an earlier run's counts (unless a level of this
        run listens already)."""
        with self._lock:
            if self._listeners:
                return
            self.iterations = {MEMORY: set(), CUPTI: set()}
            self._began.clear()
            self._asides = {MEMORY: 0, CUPTI: 0}
            self.errors, self.cupti_letters, self._said = [], set(), False
            self._holds = 1 if self._running else 0

    # -- the wrappers ------------------------------------------------------------------------
    def install(self) -> None:
        """Wrap ``torch.autograd.profiler``'s three calls (once; they stay, calling through)."""
        with self._lock:
            if self._installed:
                return
            from torch.autograd import profiler as autograd_profiler

            for name in _WRAPPED:
                original = getattr(autograd_profiler, name, None)
                if original is None:
                    continue
                self._originals[name] = original
                setattr(autograd_profiler, name, self._wrapper(name, original))
            self._installed = True

    def _wrapper(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        stops, enables = name == "_disable_profiler", name == "_enable_profiler"

        def call(*args: Any, **kwargs: Any) -> Any:
            if not stops:
                activities = args[1] if len(args) > 1 else kwargs.get("activities", ())
                self._guard(self._before_start, activities, enables)
                return original(*args, **kwargs)
            try:
                return original(*args, **kwargs)
            finally:
                self._guard(self._after_stop)

        call.__wrapped__ = original  # type: ignore[attr-defined]
        call.__name__ = name
        return call

    def _guard(self, what: Callable[..., None], *args: Any) -> None:
        """Never let xsp's stepping aside fail the program's profiler."""
        try:
            what(*args)
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            log.exception("xsp: stepping aside for the program's torch.profiler failed")

    def _before_start(self, activities: Any, enables: bool) -> None:
        """The program's profiler prepares (its warm-up: CUPTI from here on) or starts (its
        state takes the thread's slot)."""
        with self._lock:
            if not self._running:
                self._running = True
                self._holds += 1
                self._activities = _activity_names(activities)
            self._enabled = self._enabled or enables
            wanted = plan(
                self._activities,
                memory_on=MEMORY in self._listeners and self._enabled,
                cupti_on=CUPTI in self._listeners,
                shared_cupti=shared_cupti() is None,
            )
            for part, on in ((CUPTI, wanted.cupti), (MEMORY, wanted.memory)):
                if on and part not in self._aside:
                    self._aside.add(part)
                    self._asides[part] += 1
                    self._listeners[part][0]()  # steps aside

    def _after_stop(self) -> None:
        with self._lock:
            self._running = self._enabled = False
            for part in sorted(self._aside):
                self._aside.discard(part)
                if part in self._listeners:
                    self._listeners[part][1]()  # comes back

    # -- xsp's side ---------------------------------------------------------------------------
    def listen(
        self, part: str, step_aside: Callable[[], None], come_back: Callable[[], None]
    ) -> bool:
        """``part`` (MEMORY, CUPTI) runs from now on; returns whether the program's profiler
        holds it now, in which case ``come_back`` is called when that profiler stops (and
        ``step_aside`` is not called: the caller does not start it)."""
        self.install()
        import torch

        with self._lock:
            self._listeners[part] = (step_aside, come_back)
            # one started before xsp could see it: its state is in the slot, its activities
            # unknown (it stops through the wrapper all the same)
            if not self._running and torch.autograd._profiler_enabled():
                self._running = self._enabled = True
                self._activities = []
                self._holds += 1
            if part == MEMORY:
                aside = self._enabled
            else:
                aside = self._running and plan(self._activities, False, True, False).cupti
                aside = aside and shared_cupti() is not None
            if aside and part not in self._aside:
                self._aside.add(part)
                self._asides[part] += 1
            return aside

    def forget(self, part: str) -> None:
        """``part`` stopped: nothing of it is to step aside or come back."""
        with self._lock:
            self._listeners.pop(part, None)
            self._aside.discard(part)

    def holds(self, part: str) -> bool:
        return part in self._aside

    def begin_iteration(self, part: str, index: int) -> None:
        self._began[part] = (part in self._aside, self._asides[part])

    def end_iteration(self, part: str, index: int) -> None:
        """An iteration of ``part`` ended: count it if the program's profiler held it at any
        time in between."""
        aside, asides = self._began.pop(part, (False, self._asides[part]))
        if aside or part in self._aside or asides != self._asides[part]:
            self.iterations[part].add(index)

    def summary(self) -> ProgramProfilerSummary:
        """run.json's ``program_profiler``: {} when the program ran none while xsp recorded.
        Its line goes to stderr here when no spans are missing (else it is a status reason)."""
        if not self._holds:
            return {}
        letters = "".join(sorted(self.cupti_letters))
        why = shared_cupti() or ""
        line, spans_missing = reason(self.iterations[MEMORY], self.iterations[CUPTI], letters, why)
        if line is not None and not spans_missing and not self._said:
            self._said = True
            log.warning("xsp: %s", line)
        out: ProgramProfilerSummary = {"starts": self._holds, "activities": self._activities}
        if memory := self.iterations[MEMORY]:
            out["memory_iterations"] = sorted(memory)
        if cupti := self.iterations[CUPTI]:
            out["cupti_iterations"] = sorted(cupti)
        if line is not None:
            out["line"] = line
            out["spans_missing"] = spans_missing
        if self.errors:
            out["errors"] = self.errors[:3]
        return out


_watch: ProgramProfiler | None = None


def program_profiler() -> ProgramProfiler:
    global _watch
    if _watch is None:
        _watch = ProgramProfiler()
    return _watch
