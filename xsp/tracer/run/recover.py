"""What a level-set process that died left in its capture arena, converted and stored.

A program that ends with ``os._exit``, a signal or a segfault never reaches xsp's own finish. Its
capture arena (``RUN_DIR/<levels>/capture.arena``, written natively and mapped shared) still
holds every record that was complete: the iterations level M closed and level F's ops, module
calls and ranges. The runner converts those iterations and stores them beside the run.json the
process wrote when it started, with status ``partial`` and reasons that say how the program
ended and what was lost: an iteration still open, and CUPTI's records (levels L and G), which
CUPTI only delivers at its final flush.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from xsp.tracer import store
from xsp.tracer.convert.arena import ARENA_FILE, framework_records, read_arena, step_records
from xsp.tracer.convert.memory import memory_table
from xsp.tracer.convert.spans import build_table
from xsp.tracer.errors import XspError
from xsp.tracer.export.sinks import SpanBatch, StoreSink
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
    steps = step_records(contents)
    framework = framework_records(contents) if levels.framework else None
    # a rank of a multi-rank job numbers its spans as its own process would have
    rank, world_size = meta.get("rank"), meta.get("world_size")
    table, report = build_table(
        str(meta["run_id"]), levels, steps, framework, rank=rank, world_size=world_size
    )
    sink = StoreSink(run_dir)
    sink.export(SpanBatch.of(dict(meta.get("resource") or {}), table))
    measured = len(steps.iteration)
    reasons = [f"the program {ended} after {measured} measured iterations"]
    reasons.append(f"{measured} iterations recovered from the capture arena")
    memory_events = 0
    if framework is not None:
        events = memory_table(framework.memory, table)
        if events is not None:
            store.write_memory_events(run_dir, events)
            memory_events = events.num_rows
    if contents.counts.get("open_records"):
        reasons.append(
            f"{contents.counts['open_records']} records still open when it died were left out"
        )
    lost = [letter for letter, on in (("L", levels.library), ("G", levels.gpu)) if on]
    if lost:
        reasons.append(
            f"level{'s' if len(lost) > 1 else ''} {' and '.join(lost)}: CUPTI never delivered "
            "its records (they are lost)"
        )
    meta.update(
        status="partial",
        error=None,
        iterations_measured=measured,
        status_reasons=reasons,
        recovered=True,
        spans=report.spans,
        spans_by_level=report.counts_by_level,
        arena={k: int(v) for k, v in contents.counts.items()},
        files=[p.name for p in sink.files],
        memory_events=memory_events,
        finished_ns=time.time_ns(),
    )
    return meta
