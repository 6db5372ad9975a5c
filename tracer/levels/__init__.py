"""The level registry: one module per level, each with the same small interface.

A level captures one layer of the stack. Its life inside a session::

    enable()                 before the first measured iteration
    begin_iteration(i)       at each measured iteration's start, in stack order (M first)
    end_iteration(i)         at each measured iteration's end, in reverse stack order (M last)
    disable()                after the last measured iteration (or when the session closes)
    drain() -> raw records   once, after every level of the session is disabled

All five are called from the thread that runs the user's training or inference loop; enable,
disable and drain may block (they run outside the measured window), begin/end_iteration must only
append to preallocated buffers. Raw records are turned into spans later by ``tracer.convert``.

Each level is one module plus one registry entry; `check_levels` says which combinations can run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class Level(Protocol):
    """One layer of the stack that can be switched on for a run."""

    letter: str

    def enable(self) -> None: ...

    def begin_iteration(self, index: int) -> None: ...

    def end_iteration(self, index: int) -> None: ...

    def disable(self) -> None: ...

    def drain(self) -> Any: ...


LevelFactory = Callable[["LevelContext"], Level]


@dataclass(frozen=True)
class LevelContext:
    """What a level needs to know about its session when it is built.

    ``op_shapes``: record aten ops' input shapes and dtypes (level F). On by default; off saves
    a little per-op cost on the host.
    """

    device: str
    op_shapes: bool = True


def _model(ctx: LevelContext) -> Level:
    from tracer.levels.model import ModelLevel

    return ModelLevel(ctx.device)


def _framework(ctx: LevelContext) -> Level:
    from tracer.levels.framework import FrameworkLevel

    return FrameworkLevel(record_shapes=ctx.op_shapes)


def _on_cuda(ctx: LevelContext, letter: str) -> None:
    if not ctx.device.startswith("cuda"):
        from tracer.errors import ConfigError

        raise ConfigError(
            f"level {letter} records CUDA API calls and GPU work: it needs --device cuda "
            "(level L on CPU, through oneDNN, is not available yet)"
        )


def _library(ctx: LevelContext) -> Level:
    _on_cuda(ctx, "L")
    from tracer.levels.cuda import LibraryLevel

    return LibraryLevel()


def _gpu(ctx: LevelContext) -> Level:
    _on_cuda(ctx, "G")
    from tracer.levels.cuda import GpuLevel

    return GpuLevel()


#: Level letter -> factory. Imports are deferred so that reading the registry stays cheap.
REGISTRY: dict[str, LevelFactory] = {"M": _model, "F": _framework, "L": _library, "G": _gpu}


def check_levels(levels: str, device: str) -> None:
    """Raise ConfigError when a level of ``levels`` cannot run on ``device``, or with the others."""
    for letter in levels:
        if letter in ("L", "G"):
            _on_cuda(LevelContext(device), letter)
    if "F" in levels and ("L" in levels or "G" in levels):
        from tracer.errors import ConfigError

        # Seen on the H200 (torch 2.11, cupti-python 13.0): on CUDA builds the PyTorch profiler
        # behind level F registers its own CUPTI activity callbacks and timestamp source, so
        # sharing CUPTI with it shifts CUPTI's clock and corrupts memory when both shut down.
        raise ConfigError(
            f"level set {levels}: levels L and G cannot run with level F yet (PyTorch's profiler, "
            "behind F, holds CUPTI on CUDA builds); use MLG for GPU work without F"
        )


def build_levels(levels: str, ctx: LevelContext) -> list[Level]:
    """Instantiate the levels of a level set validated by ``schema.parse_levels``, in stack
    order (every letter it accepts has a registry entry)."""
    return [REGISTRY[ch](ctx) for ch in levels]
