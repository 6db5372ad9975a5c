"""When a session records: the phase of each iteration and what each iteration's end calls for.

A pure state machine (no torch, no clock, no I/O), in the manner of ``torch.profiler.schedule``
and its action table. The session asks it at every marker::

    begin()  -> Phase      the phase of the iteration beginning (DONE: none begins)
    end()    -> Boundary   what the session does now that the open iteration is over

A fixed session (``warmup`` W, ``iterations`` N) runs W warm-up iterations, then N measured
ones, then is DONE. The levels come on one warm-up iteration early (``Boundary.LEVELS_ON`` as
warm-up iteration W-2 ends; at the start when W <= 1): their own start-up cost then lands
outside the measured window. A session that warms up until the step is steady answers
LEVELS_ON with ``extend_warmup()`` instead, once per extra step.

With ``interleave`` (``xsp.tracer.capture.interleave``) every measured iteration is preceded by
an UNTRACED one, which the levels never see and which does not count towards ``index``.

A continuous session (``iterations`` 0, or a duration) measures until ``stop_measuring()``;
each measured iteration's end asks it to ``CONTINUE`` (a batch or the duration's end may be
due). Once it is steady (``unbounded``) the session's per-request path sets ``open`` and
``index`` itself: a request pays for every Python call.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["Boundary", "Phase", "Schedule"]


class Phase(Enum):
    """What kind of iteration begins."""

    WARMUP = "warmup"  # not measured (the levels may already be on in the last one)
    UNTRACED = "untraced"  # interleaved: timed with the levels below M off, not measured
    MEASURE = "measure"  # measured: the levels see its markers
    DONE = "done"  # every measured iteration has been recorded: nothing begins


class Boundary(Enum):
    """What the session does at the end of an iteration."""

    NOTHING = "nothing"
    LEVELS_ON = "levels_on"  # switch the levels on (or warm up one step longer)
    FINISH = "finish"  # the last measured iteration ended: store the run
    CONTINUE = "continue"  # a continuous session: store a batch or stop, if either is due


@dataclass
class Schedule:
    """The iteration counters of one session and the transitions between its phases."""

    warmup: int
    iterations: int  # 0: until stopped
    continuous: bool = False
    interleave: bool = False
    #: iterations ended so far, warm-up included (untraced ones are not counted)
    index: int = 0
    #: the index measuring stopped at (a duration's end); None while it has not
    stopped_at: int | None = None
    levels_on: bool = False
    #: the last measured iteration is over and the run not yet stored
    finish_due: bool = False
    #: the phase of the open iteration; None between iterations
    open: Phase | None = None
    #: the next measured slot begins with an untraced iteration (``interleave``)
    untraced_due: bool = True

    @property
    def limit(self) -> int | None:
        """The index measuring stops at; None: not yet known (until stopped)."""
        if self.stopped_at is not None:
            return self.stopped_at
        return self.warmup + self.iterations if self.iterations else None

    @property
    def measuring(self) -> bool:
        """The open iteration, or the next one to begin, is a measured one."""
        limit = self.limit
        return self.warmup <= self.index and (limit is None or self.index < limit)

    @property
    def done(self) -> bool:
        """Every measured iteration has been recorded."""
        limit = self.limit
        return limit is not None and self.index >= limit

    @property
    def measured(self) -> int:
        """The measured index of the open (or next) iteration."""
        return self.index - self.warmup

    @property
    def levels_on_at_start(self) -> bool:
        """The levels come on as the session starts: no warm-up iteration to hide it in."""
        return self.warmup <= 1

    @property
    def unbounded(self) -> bool:
        """Measuring past its first iteration with its levels on, no end known and nothing
        due: a continuous session's steady state."""
        return (
            self.continuous
            and self.levels_on
            and not self.finish_due
            and self.limit is None
            and self.index > self.warmup
        )

    def next_phase(self) -> Phase:
        if self.done:
            return Phase.DONE
        if not self.measuring:
            return Phase.WARMUP
        return Phase.UNTRACED if self.interleave and self.untraced_due else Phase.MEASURE

    def begin(self) -> Phase:
        """An iteration begins (none may be open): its phase. DONE opens nothing."""
        phase = self.next_phase()
        if phase is not Phase.DONE:
            self.open = phase
        return phase

    def end(self) -> Boundary:
        """The open iteration ends: what the session does about it."""
        phase, self.open = self.open, None
        if phase is Phase.UNTRACED:
            self.untraced_due = False
            return Boundary.NOTHING
        if phase is Phase.MEASURE and self.interleave:
            limit = self.limit
            self.untraced_due = limit is None or self.index + 1 < limit
        self.index += 1
        if self.index == self.warmup - 1 and not self.levels_on:
            return Boundary.LEVELS_ON
        if self.index == self.limit:
            self.finish_due = True
            return Boundary.FINISH
        if self.continuous and self.levels_on and self.index > self.warmup:
            return Boundary.CONTINUE
        return Boundary.NOTHING

    def extend_warmup(self) -> None:
        """One warm-up step more (the step has not settled): the levels come on a step later."""
        self.warmup += 1

    def stop_measuring(self) -> None:
        """A continuous session's duration is over: no measured iteration begins after this."""
        self.stopped_at = self.index
        self.finish_due = True

    def skip(self, count: int) -> None:
        """``count`` measured iterations were recorded without the markers (a lease)."""
        self.index += count

    def measured_ended(self) -> int:
        """The measured iterations that ended (the open one not included); below 0 while the
        warm-up is not over."""
        limit = self.limit
        ended = max(0, (limit if limit is not None else self.index) - self.warmup)
        return min(ended, self.index - self.warmup)
