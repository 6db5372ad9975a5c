"""The optional parts of a level's interface (``xsp.tracer.capture.levels``), as protocols.

A session asks a level whether it can do one of these things with ``isinstance`` on the
protocol, never on a concrete level class: a level that grows the method takes part.
``runtime_checkable`` checks only that the members exist, so a session classifies its levels
once (``xsp.tracer.capture.level_stack``), not on a service's per-request path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from xsp.core.run_sections import RunCounts
    from xsp.tracer.export.batches import BatchDrain

__all__ = ["CountsLosses", "HandsOver", "Priced", "Sampled", "StepTimer", "SwitchedPerIteration"]


@runtime_checkable
class Sampled(Protocol):
    """Records the next iterations or not (a continuous session's sampling policy, or an
    interleaved untraced iteration); sampled off it records nothing at its markers."""

    def sample(self, on: bool) -> None: ...


@runtime_checkable
class HandsOver(Protocol):
    """Stops writing a continuous session's batch and returns its drain, run later on the
    exporter's thread; the level stays installed and is enabled again."""

    def handover(self) -> BatchDrain: ...


@runtime_checkable
class CountsLosses(Protocol):
    """Says after its drain what it lost (CUPTI's dropped records): merged into run.json."""

    def counts(self) -> RunCounts: ...


@runtime_checkable
class SwitchedPerIteration(Protocol):
    """Must know before it comes on that it will be switched off and on between measured
    iterations (``xsp.tracer.capture.interleave``)."""

    def switched_per_iteration(self) -> None: ...


@runtime_checkable
class StepTimer(Protocol):
    """Times each iteration's step (level M): its device sync is what a lease times with."""

    @property
    def sync(self) -> Any: ...


@runtime_checkable
class Priced(Sampled, Protocol):
    """Its per-op cost is what the calibration prices (level F): timed sampled on and off,
    and with and without the ops' shapes."""

    @property
    def shapes_in_first_iteration_only(self) -> bool: ...

    def set_shapes(self, on: bool) -> None: ...
