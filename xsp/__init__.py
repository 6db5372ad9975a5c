"""xsp: across-stack tracing of PyTorch workloads.

Mark iterations in your own loop and trace them::

    import xsp

    with xsp.session(levels="MF", iterations=5, warmup=2, out="runs/mine/MF"):
        for batch in loader:
            with xsp.iteration():          # or call xsp.step() once per iteration
                loss = model(batch).sum()
                loss.backward()
                optimizer.step()

Or run an unmodified script under ``xsp run --levels M,MF -- python train.py``: every optimizer
step becomes one iteration, and each level set runs in its own process.

Functions:
    session(levels, iterations, warmup, out, sinks, workload, device, ...) -> Session
        Start a tracing session (also a context manager). ``levels`` is a level set such as "M"
        or "MF"; ``out`` a run directory; ``sinks`` extra span sinks (``OtlpSink``,
        ``InMemorySink``). Raises ConfigError for bad values, DeviceError for a missing GPU.
        ``iterations=0`` (or ``duration_s=``) makes it continuous, for a service: batches of
        finished iterations are stored while it runs, and ``sample_every=``/``sample_rate=``
        limit the levels below M to a sample (docs/serving.md).
    step()
        End the current iteration, if any, and begin the next. Without a session it does nothing.
    iteration()
        Context manager around one iteration; an exception marks it failed and propagates.
    current_session() -> Session | None

Algorithm notes:
    1. Levels switch on between iterations, before the first measured one; during an iteration
       they only append raw records.
    2. The model span of an iteration starts and ends right after a device synchronization, so
       its duration is the step latency.
    3. After the last measured iteration the levels switch off and their records become spans,
       nested by recorded ranges and autograd sequence numbers, then stored and exported.

Errors: every exception xsp raises is an ``XspError`` (see ``xsp.core.errors``); the traced program
never sees one from the hot path.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from xsp.core.errors import (
    ConfigError,
    DeviceError,
    ExportError,
    StoreError,
    WorkloadError,
    XspError,
)

if TYPE_CHECKING:
    from xsp.tracer.capture.session import Session

__all__ = [
    "ConfigError",
    "DeviceError",
    "ExportError",
    "Session",
    "StoreError",
    "WorkloadError",
    "XspError",
    "current_session",
    "iteration",
    "session",
    "step",
]

_log = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    if name == "Session":  # deferred: it imports torch
        from xsp.tracer.capture.session import Session

        return Session
    raise AttributeError(f"module 'xsp' has no attribute {name!r}")


def session(levels: str = "M", iterations: int = 10, warmup: int = 2, **options: Any) -> Session:
    """Create and start a tracing session; see the module docstring."""
    from xsp.tracer.capture.session import Session

    return Session(levels, iterations, warmup, **options).start()


def current_session() -> Session | None:
    from xsp.tracer.capture.session import current

    return current()


def step() -> None:
    """End the current iteration and begin the next one (no-op without a session)."""
    active = current_session()
    if active is not None:
        active.step()


@contextlib.contextmanager
def iteration() -> Iterator[None]:
    """Mark one iteration (no-op without a session)."""
    active = current_session()
    if active is None:
        yield
        return
    with active.iteration():
        yield
