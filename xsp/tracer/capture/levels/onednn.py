"""Level L on CPU: oneDNN primitive executions as library spans.

PyTorch runs convolutions (and, with mkldnn tensors, more) through oneDNN. oneDNN's verbose mode
prints one line per primitive execution, with a wall-clock start stamp when
``ONEDNN_VERBOSE_TIMESTAMP=1`` is set before oneDNN starts::

    onednn_verbose,v1,1796009213936.96,primitive,exec,cpu,convolution,jit:avx512_core,
        forward_training,<memory descriptors>,<attributes>,alg:convolution_direct,
        mb2_ic3oc8_ih32oh30kh3sh1dh0ph0_iw32ow30kw3sw1dw0pw0,0.296143

(start in ms since the epoch, duration in ms). Those lines go to the process's stdout from C, so
while the level is on, file descriptor 1 points at a temporary file; at ``disable`` the lines
that are not oneDNN's go back to the real stdout, in order, and the rest become ranges.
BLAS calls (MKL/OpenBLAS GEMMs behind aten::addmm) have no such hook and are not recorded.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import tempfile
import threading
from typing import TYPE_CHECKING, Any

from xsp.core.errors import XspError
from xsp.core.records import ApiRecords, RangeRecords

if TYPE_CHECKING:
    from xsp.tracer.capture.levels import LevelContext

__all__ = ["DOMAIN", "ONEDNN_ENV", "OneDnnLevel", "build", "environment", "parse_verbose_line"]

log = logging.getLogger(__name__)

ONEDNN_ENV = {"ONEDNN_VERBOSE_TIMESTAMP": "1"}
DOMAIN = "oneDNN"
_PREFIX = b"onednn_verbose,"


def parse_verbose_line(line: str) -> tuple[int, int, str, str] | None:
    """(start ns, end ns, primitive, detail) of an ``exec`` line with a timestamp, else None.
    ``detail`` keeps the implementation, propagation kind, algorithm and problem description."""
    fields = line.rstrip("\n").split(",")
    if len(fields) < 8 or fields[0] != "onednn_verbose":
        return None
    if fields[1].startswith("v"):  # format version marker (oneDNN 3.x)
        fields = fields[:1] + fields[2:]
    try:
        stamp_ms = float(fields[1])
    except ValueError:
        return None
    body = fields[2:]
    if len(body) < 5 or body[0] != "primitive" or body[1] != "exec":
        return None
    try:
        duration_ms = float(body[-1])
    except ValueError:
        return None
    start = int(stamp_ms * 1e6)
    primitive, implementation, prop_kind = body[3], body[4], body[5] if len(body) > 5 else ""
    problem = body[-2]
    algorithm = body[-3] if len(body) >= 4 and body[-3].startswith("alg:") else ""
    detail = " ".join(p for p in (implementation, prop_kind, algorithm, problem) if p)
    return start, start + int(duration_ms * 1e6), primitive, detail


class OneDnnLevel:
    """Level L on CPU."""

    letter = "L"

    def __init__(self) -> None:
        self._capture: Any = None
        self._saved_stdout = -1
        self._thread = 0
        self._records = ApiRecords()

    def enable(self) -> None:
        import torch

        if not torch.backends.mkldnn.is_available():
            raise XspError("level L on CPU needs a PyTorch build with oneDNN (mkldnn)")
        self._thread = threading.get_native_id()
        sys.stdout.flush()
        _flush_c_stdout()
        self._capture = tempfile.TemporaryFile()  # noqa: SIM115 - closed in disable
        self._saved_stdout = os.dup(1)
        os.dup2(self._capture.fileno(), 1)
        torch._C._verbose.mkldnn_set_verbose(1)

    def sample(self, on: bool) -> None:
        """oneDNN prints its executions from the next iteration on, or not (a continuous
        session's sampling policy; between iterations)."""
        import torch

        if self._capture is not None:
            torch._C._verbose.mkldnn_set_verbose(1 if on else 0)

    def begin_iteration(self, index: int) -> None:
        pass

    def end_iteration(self, index: int) -> None:
        pass

    def disable(self) -> None:
        if self._capture is None:
            return
        import torch

        torch._C._verbose.mkldnn_set_verbose(0)
        sys.stdout.flush()
        _flush_c_stdout()
        os.dup2(self._saved_stdout, 1)
        os.close(self._saved_stdout)
        capture, self._capture = self._capture, None
        capture.seek(0)
        self._records.library = self._split(capture)
        capture.close()

    def _split(self, capture: Any) -> RangeRecords:
        """oneDNN's exec lines -> ranges; every other line goes back to the real stdout."""
        ranges = RangeRecords()
        undated = 0
        out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else None
        for raw in capture:
            if not raw.startswith(_PREFIX):
                if out is not None:
                    out.write(raw)
                continue
            parsed = parse_verbose_line(raw.decode(errors="replace"))
            if parsed is None:
                undated += b",exec," in raw
                continue
            start, end, primitive, detail = parsed
            ranges.domain.append(DOMAIN)
            ranges.name.append(primitive)
            ranges.start_ns.append(start)
            ranges.end_ns.append(end)
            ranges.thread.append(self._thread)
            ranges.detail.append(detail)
        if out is not None:
            out.flush()
        if undated:
            log.warning(
                "xsp: %d oneDNN executions had no timestamp and were dropped: set "
                "ONEDNN_VERBOSE_TIMESTAMP=1 before oneDNN starts (xsp run does)",
                undated,
            )
        return ranges

    def drain(self) -> ApiRecords:
        records, self._records = self._records, ApiRecords()
        return records


def _flush_c_stdout() -> None:
    """Flush C's stdio buffer, where oneDNN's printf output waits when stdout is a file."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


def build(ctx: LevelContext) -> OneDnnLevel:
    """Level L of a session on the CPU (its row in ``xsp.core.levels`` names this factory)."""
    return OneDnnLevel()


def environment() -> dict[str, str]:
    """What oneDNN must find in the environment when it starts: its verbose timestamps."""
    return dict(ONEDNN_ENV)
