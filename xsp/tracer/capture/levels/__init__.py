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

Each level is one capture module here (with a factory from ``LevelContext``) plus one row of
the table of levels, ``xsp.core.levels.LEVELS``, which names that factory for each device the
level runs on, the environment it needs, and its conversion (``xsp.tracer.convert``) by dotted
path; `check_levels` and `build_levels` read it. Conversion loads without torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from xsp.core.levels import LEVELS, Capture, LevelInfo, level, resolve
from xsp.core.levelset import LevelSet

if TYPE_CHECKING:
    from xsp.tracer.capture.hooks.arena import CaptureArena
    from xsp.tracer.capture.hooks.inductor import KernelProvenance

__all__ = [
    "Level",
    "LevelContext",
    "LevelFactory",
    "build_levels",
    "check_levels",
    "level_environment",
]


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
    (``xsp.tracer.capture.hooks.inductor``).
    ``sample_run``: a continuous session's sampled iterations come in runs of this many
    (``xsp.tracer.capture.sampling``): CUPTI pauses between single ones, finalizes between runs.
    """

    device: str
    levels: LevelSet
    op_shapes: bool = True
    run_dir: Path | None = None
    multi_rank: bool = False  # collectives' sizes come from every iteration's op shapes
    sample_run: int = 1  # a continuous session samples runs of this many iterations
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
            from xsp.tracer.capture.hooks.arena import CaptureArena

            self._arena.append(CaptureArena(self.run_dir))
        arena: CaptureArena = self._arena[0]
        return arena

    @property
    def provenance(self) -> KernelProvenance:
        if not self._provenance:
            from xsp.tracer.capture.hooks.inductor import KernelProvenance

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


def check_levels(levels: LevelSet, device: str) -> None:
    """Raise ConfigError when a level of ``levels`` cannot run on ``device`` (its row in
    ``xsp.core.levels`` has no capture for the device's kind)."""
    for info in _rows(levels):
        if info.capture_on(device) is None:
            from xsp.core.errors import ConfigError

            # a level set of levels that combine freely has a smaller one that runs anywhere
            hint = "" if info.alone else f" (on CPU, use {_anywhere_sets()})"
            raise ConfigError(
                f"level set {levels}: level {info.letter} {info.summary} and needs "
                f"--device cuda{hint}"
            )


def level_environment(ctx: LevelContext) -> dict[str, str]:
    """Environment variables the levels need set before the libraries they watch start (each
    level's ``Capture.environment`` on the session's device): NVTX injection into CUPTI and the
    libraries' NVTX switches on CUDA (cuBLAS and cuDNN calls are NVTX ranges), oneDNN's verbose
    timestamps on CPU. Reading it imports nothing heavy."""
    paths = [capture.environment for capture in _captures(ctx.levels, ctx.device)]
    env: dict[str, str] = {}
    for path in dict.fromkeys(p for p in paths if p):  # levels L and G share CUPTI's
        env.update(resolve(path)())
    return env


def build_levels(levels: LevelSet, ctx: LevelContext) -> list[Level]:
    """Instantiate the levels of a level set in stack order, each by its row's factory for the
    session's device (imported only now, so that reading the table stays cheap)."""
    built = []
    for info in _rows(levels):
        capture = info.capture_on(ctx.device)
        if capture is None:
            from xsp.core.errors import ConfigError

            raise ConfigError(f"level {info.letter} {info.summary}: it needs --device cuda")
        factory: LevelFactory = resolve(capture.factory)
        built.append(factory(ctx))
    return built


def _rows(levels: LevelSet) -> list[LevelInfo]:
    return [level(letter) for letter in levels.letters]


def _captures(levels: LevelSet, device: str) -> list[Capture]:
    found = (info.capture_on(device) for info in _rows(levels))
    return [capture for capture in found if capture is not None]


def _anywhere_sets() -> str:
    """The level sets of the levels that run on every device, root first: "M, MF or MFL"."""
    letters = "".join(i.letter for i in LEVELS if i.cpu and i.cuda and not i.alone)
    sets = [letters[:n] for n in range(1, len(letters) + 1)]
    return ", ".join(sets[:-1]) + f" or {sets[-1]}"
