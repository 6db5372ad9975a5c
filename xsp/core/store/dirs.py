"""Directories written whole under a staging name, then put in place by rename: a campaign job
on a Ray worker writes its measurement beside the campaign's runs, so that a node that dies
mid-job leaves a staging directory behind, never half a run directory."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from xsp.core.errors import StoreError

__all__ = ["commit_dir"]

#: Tries before giving up on a directory that another writer keeps replacing.
_TRIES = 5


def commit_dir(staged: Path, final: Path) -> None:
    """Move ``staged`` (a finished directory on ``final``'s file system) to ``final``,
    replacing what is there: an earlier attempt's run, or a concurrent attempt's. A reader
    sees the old directory or the new one whole (for a moment, neither), never a mix."""
    aside = staged.with_name(staged.name + ".replaced")
    final.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(_TRIES):
        try:
            os.rename(staged, final)  # final absent (or an empty directory): atomic
            shutil.rmtree(aside, ignore_errors=True)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise StoreError(f"cannot move {staged} to {final}: {exc.strerror}") from exc
        try:
            os.rename(final, aside)  # the old run goes aside; the next try moves ours in
        except FileNotFoundError:
            continue  # another attempt's commit moved it first: try again
        except OSError as exc:
            raise StoreError(f"cannot replace {final}: {exc.strerror}") from exc
    raise StoreError(f"cannot move {staged} to {final}: another writer keeps replacing it")
