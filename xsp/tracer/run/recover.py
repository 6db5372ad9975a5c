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

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from xsp.core import store
from xsp.core.arena import ARENA_FILE, PENDING_ARENA_PATTERN, read_arena
from xsp.core.errors import StoreError, XspError
from xsp.core.levelset import LevelSet
from xsp.core.store import RunMeta, Status
from xsp.tracer.convert.spans import CONVERSIONS, ROOT_LEVEL
from xsp.tracer.export.finish import Losses, RunFinish, RunIdentity
from xsp.tracer.export.sinks import StoreSink

log = logging.getLogger(__name__)


def recover_run(run_dir: Path, ended: str) -> RunMeta | None:
    """Store the finished iterations of the dead process whose run directory is ``run_dir``
    (``ended``: how it ended, "was killed by SIGKILL"); returns the updated run.json, or None
    when there is nothing to recover. Never raises: a failure is logged and left in run.json.

    A continuous session (a service) may also leave batches it had drained but not yet stored
    (``capture-<part>.arena``): each becomes its own part, in order, before the open arena."""
    arenas = _arenas(run_dir)
    if not arenas:
        return None
    try:
        meta = store.read_run_meta(run_dir / store.RUN_META)
    except XspError:
        return None
    if meta.status != Status.RUNNING:
        return None
    try:
        meta = _convert(run_dir, arenas, meta, ended)
    except Exception as exc:  # the manifest says the program died; this says why nothing came
        log.error("xsp: recovering %s failed: %s", run_dir, exc)
        reasons = (*(meta.status_reasons or ()), f"recovering its capture arena failed: {exc}")
        meta = dataclasses.replace(meta, status_reasons=reasons)
    else:
        for path, _ in arenas:
            path.unlink(missing_ok=True)
    store.write_run_meta(run_dir / store.RUN_META, meta)
    return meta


def _arenas(run_dir: Path) -> list[tuple[Path, str | None]]:
    """The arenas to recover, in order, each with the part its spans go to (None: the next)."""
    pending = sorted(run_dir.glob(PENDING_ARENA_PATTERN))
    parts = [p.stem.removeprefix("capture-") for p in pending]
    found: list[tuple[Path, str | None]] = list(zip(pending, parts, strict=True))
    if (run_dir / ARENA_FILE).is_file():
        numbers = [int(p) for p in parts if p.isdigit()]
        numbers += [
            int(f.stem.removeprefix("spans-"))
            for f in run_dir.glob(store.SPAN_FILE_PATTERN)
            if f.stem.removeprefix("spans-").isdigit()
        ]
        following = f"{max(numbers) + 1:05d}" if numbers else None  # a continuous run's
        found.append((run_dir / ARENA_FILE, following))
    return found


@dataclass
class _Recovered:
    """What the arenas gave back so far, on top of what the process had stored itself."""

    next_span_id: int
    spans: int
    measured: int  # the iterations the process had stored
    memory_events: int
    by_level: dict[str, int]
    recovered: int = 0  # the iterations read back from the arenas
    reasons: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # the levels whose records died with it
    counts: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # storing the recovered spans

    @classmethod
    def stored_by_process(cls, meta: RunMeta) -> _Recovered:
        """The totals of the batches a continuous session stored before it died (none else)."""
        stored = bool(meta.files)
        return cls(
            next_span_id=meta.next_span_id or 1,
            spans=(meta.spans or 0) if stored else 0,
            measured=(meta.iterations_measured or 0) if stored else 0,
            memory_events=(meta.memory_events or 0) if stored else 0,
            by_level=dict(meta.spans_by_level or {}) if stored else {},
        )


def _convert(
    run_dir: Path, arenas: list[tuple[Path, str | None]], meta: RunMeta, ended: str
) -> RunMeta:
    sink = StoreSink(run_dir)
    finish = RunFinish(_identity(run_dir, meta), sink)
    stored_files = set(meta.files or ())
    got = _Recovered.stored_by_process(meta)
    for path, part in arenas:
        if part is not None and f"spans-{part}.parquet" in stored_files:
            continue  # its batch was stored just before the process died
        _convert_arena(finish, path, part, meta, got)
    finish.shut_down(Losses())  # a lone store sink: what fails raises
    measured = got.measured + got.recovered
    reasons = [
        f"the program {ended} after {measured} measured iterations",
        f"{got.recovered} iterations recovered from the capture arena",
        *got.reasons,
    ]
    if got.lost:
        letters = list(dict.fromkeys(got.lost))
        reasons.append(
            f"level{'s' if len(letters) > 1 else ''} {' and '.join(letters)}: CUPTI never "
            "delivered its records (they are lost)"
        )
    files = tuple(dict.fromkeys([*(meta.files or ()), *(p.name for p in sink.files)]))
    return dataclasses.replace(
        meta,
        status=Status.PARTIAL,
        error=None,
        nulls=meta.nulls | {"error"},
        iterations_measured=measured,
        status_reasons=tuple(reasons),
        recovered=True,
        spans=got.spans,
        spans_by_level=got.by_level,
        arena=got.counts,
        files=files,
        memory_events=got.memory_events,
        next_span_id=got.next_span_id,
        finished_ns=time.time_ns(),
        errors=(*(meta.errors or ()), *got.errors) if got.errors else meta.errors,
    )


def _identity(run_dir: Path, meta: RunMeta) -> RunIdentity:
    """The dead process's run, as its run.json names it; a rank of a multi-rank job numbers
    its spans as its own process would have."""
    run_id = str(meta.run_id)
    return RunIdentity(
        run_id=run_id,
        measurement_id=str(meta.measurement_id or run_id),
        levels=LevelSet(str(meta.levels)),
        workload=str(meta.workload or ""),
        resource=dict(meta.resource or {}),
        run_dir=run_dir,
        rank=meta.rank,
        world_size=meta.world_size,
    )


def _convert_arena(
    finish: RunFinish, path: Path, part: str | None, meta: RunMeta, got: _Recovered
) -> None:
    """Convert and store one arena's records as the spans of ``part``; add them to ``got``."""
    contents = read_arena(path)
    records = {}
    for letter, conversion in CONVERSIONS.items():
        if letter in finish.run.levels.letters:
            if conversion.from_arena is None:  # CUPTI's buffers died with the process
                got.lost.append(letter)
            else:
                records[letter] = conversion.from_arena(contents)
    losses = Losses()
    stored = finish.store(
        records,
        {"arena": contents.counts},
        losses,
        first_span_id=got.next_span_id,
        part=part,
    )
    if stored is None:  # level M's records are always in the arena: this one is broken
        raise StoreError(losses.fatal[0])
    got.next_span_id = stored.report.next_span_id
    got.recovered += len(records[ROOT_LEVEL].iteration)
    got.spans += stored.report.spans
    for level, n in stored.report.counts_by_level.items():
        got.by_level[level] = got.by_level.get(level, 0) + n
    got.memory_events += stored.memory_events or 0
    if contents.counts.get("open_records"):
        got.reasons.append(
            f"{contents.counts['open_records']} records still open when it died were left out"
        )
    got.reasons.extend(losses.missing)  # what the capture lost
    for key, value in contents.counts.items():  # a read arena's counts are all numbers
        if isinstance(value, int):
            got.counts[key] = got.counts.get(key, 0) + value
    got.errors.extend(stored.errors)


__all__ = ["recover_run"]
