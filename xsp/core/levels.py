"""The one table of levels: every stage that asks about a level reads its row here.

A level captures one layer of the stack. Its row says what each stage needs to know of it: its
letter and name, its place in stack order (the row's place in ``LEVELS``), how capture builds it
on each kind of device and what environment its libraries need before they start (a missing
device kind is one it cannot run on), how conversion turns its records into spans, how a dead
process's capture arena gives its records back, and whether it runs alone with the root level.

Code is named by dotted path (``"package.module:function"``), resolved only by the stage that
runs it (``resolve``): the table stays torch-free, and naming a capture factory here never makes
conversion or the store readers import capture code.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "CPU",
    "CUDA",
    "LEVELS",
    "LEVEL_BY_LETTER",
    "LEVEL_ORDER",
    "ROOT",
    "Capture",
    "LevelInfo",
    "RunsAlone",
    "alone_level_set",
    "device_kind",
    "level",
    "resolve",
]

#: The kinds of device a level may run on (``device_kind`` names a device's).
CUDA: Final = "cuda"
CPU: Final = "cpu"


@dataclass(frozen=True)
class Capture:
    """How a level records on one kind of device.

    ``factory``: a function from the session's ``LevelContext`` to the level
    (``xsp.tracer.capture.levels``). ``environment``: a function returning the environment
    variables its libraries read when they start (``xsp run`` gives them to the level-set
    process, a session sets those missing); None when it needs none."""

    factory: str
    environment: str | None = None


@dataclass(frozen=True)
class RunsAlone:
    """A level that runs in a level set of its own, with the root level only, and why; the
    parts of the messages that reject a level set mixing it with others."""

    title: str  # "the <title> level H runs alone"
    why: str
    gives: str  # "(or MH for <gives>)"


@dataclass(frozen=True)
class LevelInfo:
    """One level's row. ``name`` is the ``level`` column of its spans; ``summary`` says what it
    records, as messages put it ("level G records GPU work"). ``cuda`` and ``cpu``: how it
    records on each kind of device, None where it cannot run. ``conversion``: the function that
    adds its records' spans to the table being built (``xsp.tracer.convert.spans``), None for a
    level that makes no spans of its own (H: Nsight Compute stores its counters).
    ``arena_reader``: the function that reads its records from a capture arena
    (``xsp.core.arena``), None for a level that does not write the arena (its records die with
    the process)."""

    letter: str
    name: str
    summary: str
    cuda: Capture | None
    cpu: Capture | None
    conversion: str | None = None
    arena_reader: str | None = None
    alone: RunsAlone | None = None

    def capture_on(self, device: str) -> Capture | None:
        """How it records on ``device`` ("cpu", "cuda:0"); None where it cannot run."""
        return self.cuda if device_kind(device) == CUDA else self.cpu


_LEVELS = "xsp.tracer.capture.levels"
_CONVERT = "xsp.tracer.convert"
#: NVTX injection into CUPTI, which levels L and G on CUDA share
_NVTX = "xsp.tracer.capture.hooks.cupti:nvtx_environment"

#: Every level, in stack order: the order of level sets' letters and of span ids.
LEVELS: Final = (
    LevelInfo(
        "M",
        "model",
        "times each iteration",
        cuda=Capture(f"{_LEVELS}.model:build"),
        cpu=Capture(f"{_LEVELS}.model:build"),
        conversion=f"{_CONVERT}.model:convert_model",
        arena_reader="xsp.core.arena:step_records",
    ),
    LevelInfo(
        "F",
        "framework",
        "records modules and aten ops",
        cuda=Capture(f"{_LEVELS}.framework:build"),
        cpu=Capture(f"{_LEVELS}.framework:build"),
        conversion=f"{_CONVERT}.framework:convert_framework",
        arena_reader="xsp.core.arena:framework_records",
    ),
    LevelInfo(
        "L",
        "library",
        "records library and CUDA API calls",
        cuda=Capture(f"{_LEVELS}.cuda:build_library", environment=_NVTX),
        cpu=Capture(f"{_LEVELS}.onednn:build", environment=f"{_LEVELS}.onednn:environment"),
        conversion=f"{_CONVERT}.library:convert_library",
    ),
    LevelInfo(
        "G",
        "gpu",
        "records GPU work",
        cuda=Capture(f"{_LEVELS}.cuda:build_gpu", environment=_NVTX),
        cpu=None,
        conversion=f"{_CONVERT}.gpu:convert_gpu",
    ),
    LevelInfo(
        "H",
        "counters",
        "reads GPU hardware counters",
        cuda=Capture(f"{_LEVELS}.counters:build"),  # under Nsight Compute (xsp.tracer.run.ncu)
        cpu=None,
        # Its durations are discarded (kernel replay); its counter values join the other runs'
        # kernels by structure (iteration, kernel name, ordinal).
        alone=RunsAlone(
            "hardware-counter",
            "its kernel replay would distort every other level's timing",
            "hardware counters",
        ),
    ),
)

_BY_LETTER: Final = {info.letter: info for info in LEVELS}
#: The level every span hangs under: every level set includes it.
ROOT: Final = LEVELS[0]
#: The levels that make spans, by letter, in stack order: their letters combine freely into
#: level sets that include the root ("MF", "MFLG").
LEVEL_BY_LETTER: Final = {info.letter: info.name for info in LEVELS if info.conversion}
LEVEL_ORDER: Final = "".join(LEVEL_BY_LETTER)


def level(letter: str) -> LevelInfo:
    """The row of ``letter`` (KeyError for a letter no level has)."""
    return _BY_LETTER[letter]


def alone_level_set(info: LevelInfo) -> str:
    """The level set a level that runs alone makes with the root ("MH")."""
    return ROOT.letter + info.letter


def device_kind(device: str) -> str:
    """``CUDA`` for "cuda" or "cuda:N", else ``CPU``."""
    return CUDA if device.startswith(CUDA) else CPU


def resolve(path: str) -> Any:
    """The object a dotted path names ("package.module:function"), importing its module."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
