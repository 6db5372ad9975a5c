"""What a level-set process that died left in its capture arena, converted and stored.

A program that ends with ``os._exit``, a signal or a segfault never reaches xsp's own finish. Its
capture arena (``RUN_DIR/<levels>/capture.arena``, written natively and mapped shared) still
holds every record that was complete: the iterations level M closed and level F's ops, module
calls and ranges. The runner reads back the records of the levels whose conversion says how
(``CONVERSIONS[letter].from_arena``), then converts and stores them through the same finish as a
live session (``xsp.tracer.export.finish``), beside the run.json the process wrote when it
started, with status ``partial`` and reasons that say how the program ended and what was lost: an
iteration still open, a full arena, and CUPTI's records (levels L and G), which CUPTI only
delivers at its final flush.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from xsp.tracer import store
from xsp.tracer.convert.arena import ARENA_FILE, read_arena
from xsp.tracer.convert.spans import CONVERSIONS, ROOT_LEVEL
from xsp.tracer.errors import XspError
from xsp.tracer.export.finish import capture_losses, store_spans
from xsp.tracer.export.sinks import StoreSink
from xsp.tracer.levelset import LevelSet

log = logging.getLogger(__name__)


def recover_run(run_dir: Path, ended: str) -> dict[str, Any] | None:
    """Store the finished iterations of the dead process whose run directory is ``run_dir``
    (``ended``: how it ended, "was killed by SIGKILL"); returns the updated run.json, or None
    when there is nothing to recover. Never raises: a failure is logged and left in run.json."""
    arena_path = run_dir / ARENA_FILE
    if not arena_path.is_file():
        return None
    try:
        meta = store.read_json(run_dir / store.RUN_META)
    except XspError:
        return None
    if meta.get("status") != "running":
        return None
    try:
        meta = _convert(run_dir, arena_path, meta, ended)
    except Exception as exc:  # the manifest says the program died; this says why nothing came
        log.error("xsp: recovering %s failed: %s", run_dir, exc)
        reasons = list(meta.get("status_reasons") or [])
        meta["status_reasons"] = [*reasons, f"recovering its capture arena failed: {exc}"]
    else:
        arena_path.unlink(missing_ok=True)
    store.write_json_atomic(run_dir / store.RUN_META, meta)
    return meta


def _convert(run_dir: Path, arena_path: Path, meta: dict[str, Any], ended: str) -> dict[str, Any]:
    levels = LevelSet(str(meta["levels"]))
    contents = read_arena(arena_path)
    records, lost = {}, []
    for letter, conversion in CONVERSIONS.items():
        if letter in levels.letters:
            if conversion.from_arena is None:  # CUPTI's buffers died with the process
                lost.append(letter)
            else:
                records[letter] = conversion.from_arena(contents)
    sink = StoreSink(run_dir)
    stored = store_spans(
        records,
        sink,
        run_id=str(meta["run_id"]),
        levels=levels,
        resource=dict(meta.get("resource") or {}),
        run_dir=run_dir,
        # a rank of a multi-rank job numbers its spans as its own process would have
        rank=meta.get("rank"),
        world_size=meta.get("world_size"),
    )
    measured = len(records[ROOT_LEVEL].iteration)
    reasons = [f"the program {ended} after {measured} measured iterations"]
    reasons.append(f"{measured} iterations recovered from the capture arena")
    if contents.counts.get("open_records"):
        reasons.append(
            f"{contents.counts['open_records']} records still open when it died were left out"
        )
    reasons.extend(capture_losses({"arena": contents.counts}))
    if lost:
        reasons.append(
            f"level{'s' if len(lost) > 1 else ''} {' and '.join(lost)}: CUPTI never delivered "
            "its records (they are lost)"
        )
    if stored.errors:
        meta["errors"] = [*(meta.get("errors") or []), *stored.errors]
    meta.update(
        status="partial",
        error=None,
        iterations_measured=measured,
        status_reasons=reasons,
        recovered=True,
        spans=stored.report.spans,
        spans_by_level=stored.report.counts_by_level,
        arena={k: int(v) for k, v in contents.counts.items()},
        files=[p.name for p in sink.files],
        memory_events=stored.memory_events or 0,
        finished_ns=time.time_ns(),
    )
    return meta
