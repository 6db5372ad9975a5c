"""The level registry: one module per level, each with the same small interface.

A level captures one layer of the stack. Its life inside a session::

    enable()                 before the first measured iteration
    begin_iteration(i)       at each measured iteration's start, in stack order (M first)
    end_iteration(i)         at each measured iteration's end, in reverse stack order (M last)
    disable()                after the last measured iteration (or when the session closes)
    drain() -> raw records   once, after every level of the session is disabled
    counts() -> dict         optional, after drain: what the level lost (merged into run.json)
    sample(on)               optional, between iterations of a continuous session: record the
                             next iterations or not (its sampling policy, level M excepted);
                             sampled off, a level records nothing at its iteration markers, and
                             a service's session may leave them out
    handover() -> drain      optional, a continuous session's batch boundary: stop writing
                             the batch (still installed; enable() follows) and return its
                             drain, a function of the batch's arena contents that returns its
                             records and counts, run later on the exporter's thread (the levels
                             that write the capture arena go on into a fresh one; levels L and
                             G on CUDA flush and decode CUPTI's records here and record on)

A continuous session (a service, docs/serving.md) runs this life once per batch of iterations:
handover (or disable and drain), enable again, into a fresh capture arena.

All of them but a handover's drain are called from the thread that runs the user's training or
inference loop; enable, disable and drain may block (they run outside the measured window),
begin/end_iteration, sample and handover run between a service's requests and must be cheap.

Each level is one capture module here plus one entry in ``REGISTRY``; `check_levels` says which
combinations can run. Its records become spans through its entry under the same letter in
``xsp.tracer.convert.spans.CONVERSIONS`` (one conversion module, and for the levels that write the
capture arena, how a dead process's arena gives their records back). The two registries sit on
either side of the capture -> convert arrow: conversion loads without torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from xsp.core.levelset import LevelSet

if TYPE_CHECKING:
    from xsp.tracer.capture.arena import CaptureArena
    from xsp.tracer.capture.inductor import KernelProvenance


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

    ``levels``: the whole level set of the session.
    ``op_shapes``: record aten ops' input shapes and dtypes (level F). On by default; off saves
    a little per-op cost on the host.
    ``arena``: the session's capture arena (levels M and F write into it); built on first use.
    ``provenance``: where torch.compile's kernels came from (level F reads it); installed on
    first use, which a session makes at its start whatever its levels, so that every level
    set's process compiles the same code and shares inductor's caches
    (``xsp.tracer.capture.inductor``).
    """

    device: str
    levels: LevelSet
    op_shapes: bool = True
    run_dir: Path | None = None
    multi_rank: bool = False  # collectives' sizes come from every iteration's op shapes
    _arena: list[Any] = field(default_factory=list, compare=False, repr=False)
    _provenance: list[Any] = field(default_factory=list, compare=False, repr=False)

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def uses_cupti(self) -> bool:
        """Levels L or G on CUDA."""
        return self.on_cuda and (self.levels.library or self.levels.gpu)

    @property
    def arena(self) -> CaptureArena:
        if not self._arena:
            from xsp.tracer.capture.arena import CaptureArena

            self._arena.append(CaptureArena(self.run_dir))
        arena: CaptureArena = self._arena[0]
        return arena

    @property
    def provenance(self) -> KernelProvenance:
        if not self._provenance:
            from xsp.tracer.capture.inductor import KernelProvenance

            self._provenance.append(KernelProvenance())
            self._provenance[0].install()
        provenance: KernelProvenance = self._provenance[0]
        return provenance

    def uninstall_provenance(self) -> None:
        """Put inductor back as it was: the session is over."""
        if self._provenance:
            self._provenance[0].uninstall()

    def discard_arena(self) -> None:
        if self._arena:
            self._arena[0].discard()

    def keep_arena(self) -> Path | None:
        """Close the capture arena but leave its file, whose path this returns (None without
        one): the raw records of a run whose conversion failed."""
        if not self._arena:
            return None
        self._arena[0].close()
        path: Path = self._arena[0].path
        return path


def _model(ctx: LevelContext) -> Level:
    from xsp.tracer.capture.levels.model import ModelLevel

    return ModelLevel(ctx.device, ctx.arena)


def _framework(ctx: LevelContext) -> Level:
    from xsp.core import config
    from xsp.tracer.capture.levels.framework import FrameworkLevel

    # a multi-rank job's collective sizes come from each iteration's own shapes
    every = ctx.multi_rank or config.op_shape_iterations() == "every"
    return FrameworkLevel(
        ctx.arena, ctx.provenance, record_shapes=ctx.op_shapes, every_iteration=every
    )


def _library(ctx: LevelContext) -> Level:
    if not ctx.on_cuda:
        from xsp.tracer.capture.levels.onednn import OneDnnLevel

        return OneDnnLevel()
    from xsp.tracer.capture.levels.cuda import LibraryLevel

    return LibraryLevel(with_ops=ctx.levels.framework)


def _gpu(ctx: LevelContext) -> Level:
    if not ctx.on_cuda:
        from xsp.core.errors import ConfigError

        raise ConfigError("level G records GPU work: it needs --device cuda")
    from xsp.tracer.capture.levels.cuda import GpuLevel

    return GpuLevel(with_ops=ctx.levels.framework)


def _counters(ctx: LevelContext) -> Level:
    if not ctx.on_cuda:
        from xsp.core.errors import ConfigError

        raise ConfigError("level H reads GPU hardware counters: it needs --device cuda")
    from xsp.tracer.capture.levels.counters import CounterLevel

    return CounterLevel(ctx.device)


#: Level letter -> factory. Imports are deferred so that reading the registry stays cheap.
REGISTRY: dict[str, LevelFactory] = {
    "M": _model,
    "F": _framework,
    "L": _library,
    "G": _gpu,
    "H": _counters,  # level set MH only, under Nsight Compute (xsp.tracer.run.ncu)
}


def check_levels(levels: LevelSet, device: str) -> None:
    """Raise ConfigError when a level of ``levels`` cannot run on ``device``."""
    if levels.gpu and not device.startswith("cuda"):
        from xsp.core.errors import ConfigError

        raise ConfigError(
            f"level set {levels}: level G records GPU work and needs --device cuda "
            "(on CPU, use M, MF or MFL)"
        )
    if levels.counters and not device.startswith("cuda"):
        from xsp.core.errors import ConfigError

        raise ConfigError(
            f"level set {levels}: level H reads GPU hardware counters and needs --device cuda"
        )


def level_environment(ctx: LevelContext) -> dict[str, str]:
    """Environment variables the levels need set before the libraries they watch start: NVTX
    injection into CUPTI and the libraries' NVTX switches on CUDA (cuBLAS and cuDNN calls are
    NVTX ranges), oneDNN's verbose timestamps on CPU. Reading it imports nothing heavy."""
    if ctx.uses_cupti:
        from xsp.tracer.capture.cupti import nvtx_environment

        return nvtx_environment()
    if ctx.levels.library and not ctx.on_cuda:
        from xsp.tracer.capture.levels.onednn import ONEDNN_ENV

        return dict(ONEDNN_ENV)
    return {}


def build_levels(levels: LevelSet, ctx: LevelContext) -> list[Level]:
    """Instantiate the levels of a level set in stack order (every letter a ``LevelSet``
    accepts has a registry entry)."""
    return [REGISTRY[ch](ctx) for ch in levels.letters]
