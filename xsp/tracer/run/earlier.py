"""An output directory that holds an earlier measurement: ``xsp run --out DIR`` refuses it,
and with ``--replace`` removes that measurement's parts before measuring again.

A measurement's parts are its manifest, its level-set directories (each holds a run.json), the
further M processes' directory, a stored reconstruction and ``xsp estimate``'s timings (or a
single run's files, where ``--out`` once named a level set's own directory). Whatever else the
directory holds (a report the user wrote there, notes) is left as it is. There is nothing to resume: each
``xsp run`` measures every level set it is asked for, so a directory an interrupted run left is
an earlier measurement too.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from xsp.core import store
from xsp.core.errors import StoreError
from xsp.core.store.op_timings import ESTIMATES_DIR
from xsp.tracer.run import m_processes

__all__ = ["earlier_parts", "refuse_or_remove"]


def earlier_parts(out: Path) -> list[Path]:
    """The parts of an earlier measurement in ``out``, in name order; empty where there is
    none (``out`` missing, empty, or holding other files only)."""
    if not out.is_dir():
        return []
    # a run's own files at the top (``--out`` once named a level set's directory)
    parts = [out / n for n in (store.MANIFEST, store.RUN_META) if (out / n).is_file()]
    parts += sorted(p.parent for p in out.glob(f"*/{store.RUN_META}"))
    parts += [
        out / name
        for name in (m_processes.DIRECTORY, store.RECONSTRUCTED)
        if (out / name).is_dir() and out / name not in parts
    ]
    # ``xsp estimate``'s timings were taken for that measurement's ops (on its device): left,
    # they would stand in for the new measurement's modelled estimates
    if parts and (out / ESTIMATES_DIR).is_dir():
        parts.append(out / ESTIMATES_DIR)
    return sorted(set(parts))


def refuse_or_remove(out: Path, replace: bool, remove: bool = True) -> None:
    """Refuse ``out`` when it holds an earlier measurement, in one line that names it, unless
    ``replace``; then (with ``remove``) take the earlier measurement's parts away."""
    parts = earlier_parts(out)
    if not parts:
        return
    if not replace:
        names = ", ".join(p.name for p in parts)
        raise StoreError(
            f"{out} holds an earlier measurement ({names}): pass --replace to measure into it "
            "again (those are removed first), or choose another --out"
        )
    if not remove:
        return
    for part in parts:
        if part == out / store.RUN_META:
            store.reset_run_dir(out)  # its span parts, run.json, memory and monitor files
            continue
        try:
            if part.is_dir() and not part.is_symlink():
                shutil.rmtree(part)
            else:
                part.unlink()
        except OSError as exc:
            raise StoreError(f"cannot replace {part}: {exc.strerror or exc}") from exc
