"""The ops a kernel-changing fix touches, and their times measured in isolation: the file that
``xsp estimate RUN`` writes (``RUN/estimates/<fix>.json``) and the analysis reads.

One ``OpCase`` is one distinct forward op of the measurement (a convolution, a batch norm, a
GEMM) with its recorded input shapes and, for a convolution, the stride and padding worked out
from its output's shape; its backward is the autograd node of the same sequence number. The
estimator (``xsp.tracer.workloads.isolation``) times each case on the device without and with
the fix (``CaseTiming``); the analysis (``xsp.analysis.estimates``) scales the case's recorded
spans by those ratios and replays the step. The tracer writes this file and the analysis reads
it, so its format lives here, where neither imports the other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from xsp.core.errors import StoreError
from xsp.core.store.json_io import read_json, write_json_atomic

__all__ = [
    "ESTIMATES_DIR",
    "FORMAT",
    "CaseTiming",
    "OpCase",
    "OpTimings",
    "read_timings",
    "timings_path",
    "write_timings",
]

#: The measurement's sub-folder of isolation timings, one file per fix; a level set is a folder
#: with a run.json, so the measurement's readers pass it by.
ESTIMATES_DIR = "estimates"
FORMAT = "xsp-op-timings/1"


@dataclass(frozen=True)
class OpCase:
    """One distinct op to time: ``op`` (``aten::convolution``, ``aten::batch_norm``,
    ``aten::addmm``, ``aten::mm``, ``aten::bmm``, ``aten::baddbmm``), its inputs' shapes and
    dtypes as F recorded them ([] for an input that is not a tensor), a convolution's
    ``stride``, ``padding``, ``dilation`` and ``groups``; ``backward``: the step runs its
    autograd node; ``input_grad``: that node computes the input's gradient (not for the
    image); ``per_iteration``: how many of the step's ops it stands for."""

    key: str
    op: str
    shapes: list[list[int]]
    dtypes: list[str]
    stride: list[int] = field(default_factory=list)
    padding: list[int] = field(default_factory=list)
    dilation: list[int] = field(default_factory=list)
    groups: int = 1
    training: bool = False
    backward: bool = False
    input_grad: bool = True
    per_iteration: float = 0.0


@dataclass(frozen=True)
class CaseTiming:
    """One case's median time (µs) without (``base``) and with (``fixed``) the fix, forward and,
    where the step runs it, backward."""

    key: str
    base_forward_us: float
    fixed_forward_us: float
    base_backward_us: float | None = None
    fixed_backward_us: float | None = None


@dataclass(frozen=True)
class OpTimings:
    """What one ``xsp estimate`` measured for one fix on one device."""

    fix: str
    device: str
    torch: str
    cases: list[OpCase]
    timings: list[CaseTiming]
    format: str = FORMAT

    def by_key(self) -> dict[str, CaseTiming]:
        return {t.key: t for t in self.timings}


def timings_path(root: Path, fix: str) -> Path:
    return root / ESTIMATES_DIR / f"{fix}.json"


def write_timings(root: Path, found: OpTimings) -> Path:
    path = timings_path(root, found.fix)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, asdict(found))
    return path


def read_timings(root: Path, fix: str) -> OpTimings | None:
    """The fix's timings of the measurement ``root``; None when it has none. A file of another
    format is a StoreError naming it."""
    path = timings_path(root, fix)
    if not path.is_file():
        return None
    data = read_json(path)
    if data.get("format") != FORMAT:
        raise StoreError(f"{path}: not an {FORMAT} file (format {data.get('format')!r})")
    try:
        return OpTimings(
            fix=str(data["fix"]),
            device=str(data["device"]),
            torch=str(data["torch"]),
            cases=[OpCase(**_fields(c, OpCase)) for c in data["cases"]],
            timings=[CaseTiming(**_fields(t, CaseTiming)) for t in data["timings"]],
        )
    except (KeyError, TypeError) as exc:
        raise StoreError(f"{path}: unreadable op timings ({exc})") from exc


def _fields(value: Any, kind: type) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{kind.__name__} is not an object")
    names = {f.name for f in fields(kind)}
    return {k: v for k, v in value.items() if k in names}
