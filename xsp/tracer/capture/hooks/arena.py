"""The level-set process's capture arena: where levels M and F write their records natively.

It is a sparse file (``capture.arena`` in the run directory, or a temporary file for a session
without one), mapped shared, so that if the program dies the runner still reads every iteration
that finished (``xsp.tracer.run.recover``). Opened when the levels come on, read once after they
are off, removed once the run is stored.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np

from xsp.core import config
from xsp.core.arena import ARENA_FILE, ArenaContents, read_arena
from xsp.core.run_sections import ArenaCounts

__all__ = ["CaptureArena"]


class CaptureArena:
    def __init__(self, run_dir: Path | None) -> None:
        from xsp.tracer.native.build import load

        self.native: ModuleType = load()
        if run_dir is not None:
            self.path = run_dir / ARENA_FILE
            self._temporary = False
        else:
            handle, name = tempfile.mkstemp(prefix="xsp-", suffix=".arena")
            os.close(handle)
            self.path, self._temporary = Path(name), True
        self._open = False
        self._opened = False  # ever: a session whose levels never came on has no file to read
        self._contents: ArenaContents | None = None

    def open(self) -> None:
        if not self._open and self._contents is None:
            self.native.arena_open(str(self.path), config.arena_bytes())
            self._open = self._opened = True

    def contents(self) -> ArenaContents:
        """Stop recording and read what was recorded (once; later calls return the same)."""
        if self._contents is None and not self._opened:
            self._contents = ArenaContents.empty()
        if self._contents is None:
            counts: ArenaCounts = self.native.arena_counts() if self._open else {}
            self.close()
            self._contents = read_arena(self.path)
            self._contents.counts.update(counts)
        return self._contents

    def records_written(self, kinds: tuple[int, ...]) -> int:
        """How many complete records of ``kinds`` the arena holds so far (the calibration's
        count; a read of the file, which recording goes on writing)."""
        if not self._open:
            return 0
        return int(np.isin(read_arena(self.path).records["kind"], kinds).sum())

    def close(self) -> None:
        if self._open:
            self._open = False
            self.native.arena_close()

    def rotate(self, pending: Path | None) -> tuple[Path | None, ArenaCounts]:
        """Recycle the arena between two batches of a continuous session, once the levels have
        stopped writing it: its file moves aside to ``pending`` (kept until that batch is
        stored, so that a crash before then loses none of it; a temporary arena's stays where
        it is, for the exporter to read and remove) and the next ``open`` starts an empty one.
        Returns where the file went (None when it was never written) and the native counts
        that the file does not hold (``read_arena`` reads the rest)."""
        counts: ArenaCounts = self.native.arena_counts() if self._open else {}
        self.close()
        moved = None
        if self._opened and self.path.exists():
            moved = self.path
            if pending is not None and not self._temporary:
                os.replace(self.path, pending)
                moved = pending
        if self._temporary:  # a new temporary file for the next batch
            handle, name = tempfile.mkstemp(prefix="xsp-", suffix=".arena")
            os.close(handle)
            self.path = Path(name)
        self._contents = None
        self._opened = False
        return moved, counts

    def discard(self) -> None:
        """Remove the file: the run is stored (or there is no run directory to recover into)."""
        self.close()
        with contextlib.suppress(OSError):
            self.path.unlink()
