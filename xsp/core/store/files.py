"""The run store: a directory per leveled measurement, a sub-directory per level-set run.

Layout::

    RUN_DIR/
      manifest.json          the measurement: workload, level sets, per-run status (runner)
      M/run.json             one level-set run: resource attributes, status, counts, files
      M/spans-00000.parquet  span rows following tracer.schema.SPAN_SCHEMA (zstd, dictionaries)
      MF/...
      MH/counters.parquet    the hardware-counter run: one row per kernel (tracer.convert.ncu),
                             beside its Nsight Compute report (counters.ncu-rep) and log

Parquet keeps the store columnar and embedded; DuckDB queries it in place
(``SELECT * FROM read_parquet('RUN_DIR/*/spans-*.parquet')``). Every reader error names the file,
and what a reader leaves out (a level set whose directory is missing, an interrupted one, a
missing manifest) it says, as a warning line.

A damaged file is an error, never data: every parquet file is written with page checksums (CRC32)
that every read verifies, and span values that cannot be (a negative duration or start, an end
past the int64 range, a null id, name or time) are refused on read (``check_spans``), since a
flipped bit can still leave a page whose checksum is absent (files of older writers).
"""

from __future__ import annotations

import fnmatch
import gzip
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from xsp.core import schema
from xsp.core.arena import PENDING_ARENA_PATTERN
from xsp.core.columns import NullColumns
from xsp.core.errors import DamagedFileError, StoreError
from xsp.core.levelset import LevelSet
from xsp.core.parquet_pages import has_page_checksums
from xsp.core.store.documents import Manifest, RunMeta, Status, read_run_meta, write_run_meta
from xsp.core.store.json_io import read_json

__all__ = [
    "COUNTERS",
    "FOREIGN_LEVELS",
    "MANIFEST",
    "MEMORY",
    "MEMORY_PART_PATTERN",
    "MONITOR",
    "NCU_LOG",
    "NCU_REPORT",
    "PARQUET_OPTIONS",
    "RECONSTRUCTED",
    "RESOURCE_PART_PATTERN",
    "RUN_META",
    "SPAN_FILE_PATTERN",
    "Run",
    "check_creatable",
    "check_output",
    "check_run_destination",
    "check_spans",
    "check_writable",
    "conform",
    "open_measurement",
    "open_output",
    "open_run",
    "read_parquet",
    "read_resources",
    "read_span_file",
    "read_spans",
    "reset_run_dir",
    "write_counters",
    "write_memory_events",
    "write_monitor_samples",
    "write_resource_part",
    "write_run",
    "write_span_part",
]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
RUN_META = "run.json"
#: Where ``xsp analyze --save-reconstruction`` stores a measurement's reconstruction.
RECONSTRUCTED = "reconstructed"
MONITOR = "monitor.parquet"
MEMORY = "memory.parquet"
#: A continuous session's allocator events, one part per stored batch beside its span part.
MEMORY_PART_PATTERN = "memory-*.parquet"
#: The level-set directory the collector gives spans without xsp.levels (another OTel sender's)
FOREIGN_LEVELS = "otlp"
#: A hardware-counter run's tables and Nsight Compute's own files (``xsp.tracer.run.ncu``).
COUNTERS = "counters.parquet"
NCU_REPORT = "counters.ncu-rep"
NCU_LOG = "ncu.log"
SPAN_FILE_PATTERN = "spans-*.parquet"
#: A collected run's senders' resources, one part beside each span part (the collector's
#: ``resources-<part>.parquet``: resource_id, resource as stored JSON); run.json stays small.
RESOURCE_PART_PATTERN = "resources-*.parquet"
#: Names that are a store's own files wherever they sit in a run directory.
_STORE_NAMES = (
    MANIFEST,
    RUN_META,
    MONITOR,
    MEMORY,
    COUNTERS,
    NCU_REPORT,
    NCU_LOG,
    SPAN_FILE_PATTERN,
    RESOURCE_PART_PATTERN,
)

# Parquet settings that keep a span near 10 bytes on disk: zstd over dictionary-encoded strings
# and delta-encoded integer columns (ids and start times grow steadily); an OTLP column
# (schema.OTLP_COLUMNS) that a part's spans leave null is left out of it (readers add it back).
_DELTA_COLUMNS = (
    "span_id",
    "parent_span_id",
    "start_ns",
    "dur_ns",
    "thread_id",
    "seq_nr",
    "correlation_id",
)
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": [c.name for c in schema.COLUMNS if c.name not in _DELTA_COLUMNS],
    "column_encoding": {name: "DELTA_BINARY_PACKED" for name in _DELTA_COLUMNS},
    "write_statistics": ["iteration", "start_ns"],
}
#: Every parquet file of the store: a CRC32 per page (4 bytes a page), checked on every read.
_CHECKSUMS: dict[str, Any] = {"write_page_checksum": True}
_INT64_MAX = (1 << 63) - 1


def write_counters(run_dir: Path, counters: pa.Table) -> None:
    """Store a hardware-counter run's table (``counters.parquet``), whole or not at all."""
    _write_parquet(run_dir / COUNTERS, counters, compression="zstd")


def read_parquet(path: Path, what: str, columns: list[str] | None = None) -> pa.Table:
    """One parquet file of the store, its page checksums verified; a file that cannot be read
    whole is a one-line DamagedFileError naming it."""
    try:  # one file: ParquetFile; read_table imports pyarrow.dataset, and with it pandas (0.3 s)
        with pq.ParquetFile(path, page_checksum_verification=True) as parquet:
            return parquet.read(columns=columns)
    except (OSError, pa.ArrowException) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DamagedFileError(f"{path}: corrupt or truncated {what} file ({reason})") from exc


def write_memory_events(run_dir: Path, events: pa.Table, part: str | None = None) -> None:
    """Store a run's allocator events (``memory.parquet``; a continuous session's batch
    ``part``: ``memory-<part>.parquet``), whole or not at all."""
    path = run_dir / (MEMORY if part is None else f"memory-{part}.parquet")
    _write_parquet(path, events.unify_dictionaries())  # as write_span_part


def write_monitor_samples(run_dir: Path, samples: pa.Table) -> None:
    """Store a run's GPU monitor samples (``monitor.parquet``), whole or not at all."""
    _write_parquet(run_dir / MONITOR, samples)


def check_creatable(directory: Path) -> None:
    """Fail early, with the path in the message, if ``directory`` could not be made and written
    (its nearest existing ancestor is not a writable directory), without making it: a check
    that comes before others that may still refuse the run."""
    existing = directory
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise StoreError(f"cannot write to {directory}: {existing} is not a directory")
    try:  # a probe made and removed at once: permissions alone do not say (root, /proc)
        os.rmdir(tempfile.mkdtemp(prefix=".xsp-write-test-", dir=existing))
    except OSError as exc:
        raise StoreError(f"cannot write to {directory}: {exc.strerror or exc}") from exc


def check_writable(directory: Path) -> None:
    """Fail early, with the path in the message, if spans could not be written there."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # a new file of its own (O_EXCL): a fixed name planted as a link would be written through
        fd, probe = tempfile.mkstemp(prefix=".xsp-write-test-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise StoreError(f"cannot write to {directory}: {exc.strerror or exc}") from exc


def reset_run_dir(run_dir: Path) -> None:
    """Remove the span files and run.json an earlier run left in ``run_dir`` (a re-run replaces
    its level-set run; nothing else in the directory is touched)."""
    for path in [
        *run_dir.glob(SPAN_FILE_PATTERN),
        run_dir / RUN_META,
        run_dir / MONITOR,
        run_dir / MEMORY,
        *run_dir.glob(MEMORY_PART_PATTERN),
        *run_dir.glob(RESOURCE_PART_PATTERN),
        # an earlier service's batches still waiting: never recovered into this run
        *run_dir.glob(PENDING_ARENA_PATTERN),
        run_dir / COUNTERS,
    ]:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot replace {path}: {exc.strerror or exc}") from exc


def write_span_part(run_dir: Path, table: pa.Table, name: str | None = None) -> Path:
    """Write one parquet part of a run; parts are numbered in write order unless ``name`` (the
    part between ``spans-`` and ``.parquet``) is given, which makes a rewrite idempotent."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if name is None:
        name = f"{len(list(run_dir.glob(SPAN_FILE_PATTERN))):05d}"
    path = run_dir / f"spans-{name}.parquet"
    # One dictionary per column across the table's chunks (the conversion's blocks each have
    # their own): with several, the parquet writer held 54 MB more while writing 191k spans.
    table = table.cast(schema.SPAN_SCHEMA).unify_dictionaries()
    unused = [n for n in schema.OTLP_COLUMNS if table.column(n).null_count == table.num_rows]
    table = table.drop_columns(unused)  # xsp's own leave them all: its parts as before OTLP's
    _write_parquet(path, table, **PARQUET_OPTIONS)
    return path


def write_resource_part(run_dir: Path, name: str, resources: Mapping[str, Any]) -> Path:
    """The resources (by resource id, as stored: ``decode.resource_json``'s) of the senders of
    span part ``name``, written before it (whole or not at all, a rewrite replaces it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f"resources-{name}.parquet"
    ids = sorted(resources)
    texts = [json.dumps(resources[i], separators=(",", ":"), sort_keys=True) for i in ids]
    table = pa.table(
        {"resource_id": pa.array(ids, pa.string()), "resource": pa.array(texts, pa.string())}
    )
    _write_parquet(path, table, compression="zstd")
    return path


def read_resources(run_dir: Path, meta: RunMeta) -> dict[str, Any] | None:
    """A collected run's senders' resources by id: its resources parts' and run.json's
    "resources" (where an older collector kept them all); None where it has neither."""
    found: dict[str, Any] = dict(meta.resources or {})
    parts = sorted(run_dir.glob(RESOURCE_PART_PATTERN))
    for path in parts:
        table = read_parquet(path, "resources")
        ids = table.column("resource_id").to_pylist()
        for rid, text in zip(ids, table.column("resource").to_pylist(), strict=True):
            if rid is not None and rid not in found and text is not None:
                found[rid] = json.loads(text)
    return found if parts or meta.resources is not None else None


def _write_parquet(path: Path, table: pa.Table, **options: Any) -> None:
    """Write ``table`` to ``path`` whole or not at all: into a temporary file of this process's
    own (a killed collector's worker may still be finishing the same part while the restarted
    collector replays it), synced, then renamed over ``path``."""
    tmp = path.with_suffix(f".parquet.{os.getpid()}.tmp")
    try:
        tmp.unlink(
            missing_ok=True
        )  # a leftover (or a planted symbolic link): never written through
        pq.write_table(table, tmp, **_CHECKSUMS, **options)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"cannot write {path}: {exc}") from exc


def write_run(
    run_dir: Path, table: pa.Table, levels: str, resource: dict[str, Any], **meta: Any
) -> Path:
    """Store ``table`` as one complete run: any earlier run there replaced, one span part, and
    run.json (status ok unless ``meta`` says otherwise)."""
    reset_run_dir(run_dir)
    write_span_part(run_dir, table)
    document = {
        "format": schema.STORE_FORMAT,
        "levels": levels,
        "status": Status.OK.value,
        "resource": resource,
        **meta,
    }
    write_run_meta(run_dir / RUN_META, RunMeta.from_json(document))
    return run_dir


@dataclass(frozen=True)
class Run:
    """One level-set run read back from the store: ``meta`` its run.json as stored,
    ``document`` the same typed."""

    path: Path
    meta: dict[str, Any]

    @cached_property
    def document(self) -> RunMeta:
        return RunMeta.from_json(self.meta)

    @property
    def levels(self) -> str:
        levels = self.document.levels
        return levels if levels is not None else self.path.name

    @property
    def level_set(self) -> LevelSet:
        """``levels`` parsed: what the run recorded (``open_run`` has checked it)."""
        return LevelSet(self.levels)

    @property
    def resource(self) -> dict[str, Any]:
        return dict(self.document.resource or {})

    @cached_property
    def resources(self) -> dict[str, Any] | None:
        """A collected run's senders' resources by id (``read_resources``)."""
        return read_resources(self.path, self.document)

    @property
    def span_files(self) -> list[Path]:
        return sorted(self.path.glob(SPAN_FILE_PATTERN))

    def spans(self) -> pa.Table:
        """All span rows of this run, validated against the schema."""
        return read_spans(self.span_files)

    def monitor(self) -> pa.Table | None:
        """The GPU monitor's raw samples (one row per sample), None when none were taken."""
        return self._side_table(MONITOR, "monitor")

    def memory(self) -> pa.Table | None:
        """Level F's allocator events, each with its span and layer; None when none (a
        continuous session's parts, ``memory-*.parquet``, together)."""
        parts = sorted(self.path.glob(MEMORY_PART_PATTERN))
        if not parts:
            return self._side_table(MEMORY, "memory")
        return pa.concat_tables(
            [read_parquet(p, "memory") for p in parts], promote_options="permissive"
        )

    def _side_table(self, name: str, what: str) -> pa.Table | None:
        path = self.path / name
        if not path.exists():
            return None
        return read_parquet(path, what)

    @property
    def is_counter_run(self) -> bool:
        """The hardware-counter run (level set MH): its step times are those of kernel replay."""
        return self.level_set.counters

    def counters(self) -> pa.Table | None:
        """A hardware-counter run's counter table (one row per profiled kernel; columns in
        ``xsp.tracer.convert.ncu``), None when it has none."""
        return self._side_table(COUNTERS, "counter")


def read_spans(files: list[Path]) -> pa.Table:
    """The span rows of ``files``, each file's checksums and values checked."""
    tables = [read_span_file(path) for path in files]
    if not tables:
        return schema.SPAN_SCHEMA.empty_table()
    return pa.concat_tables(tables)


def read_span_file(path: Path) -> pa.Table:
    """One span part, checked (``read_parquet``, ``check_spans``) and conformed to the schema."""
    table = read_parquet(path, "span")
    _note_without_checksums(path)
    missing = [c for c in schema.REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise StoreError(f"{path}: not an xsp span file (missing columns {', '.join(missing)})")
    table = conform(table, path)
    check_spans(table, path)
    return table


_NOTED: set[Path] = set()


def _note_without_checksums(path: Path) -> None:
    """One line, once, for a span part of a writer older than page checksums: its values are
    checked (``check_spans``), but a flipped bit inside a valid range would pass."""
    if path in _NOTED:
        return
    try:
        with pq.ParquetFile(path) as parquet:
            checked = has_page_checksums(parquet, path)
    except (OSError, pa.ArrowException):  # read_parquet has read it whole just now
        return
    if not checked:
        _NOTED.add(path)
        log.warning(
            "xsp: warning: %s has no page checksums (written before xsp wrote them): a damaged "
            "value in it may go unnoticed",
            path,
        )


def check_spans(table: pa.Table, path: Path) -> None:
    """Refuse values no writer stores: a null in a required column, a negative start or
    duration, or an end (start + duration) past the int64 range, i.e. before its start once
    wrapped. Each is a DamagedFileError naming the file, the column and how many spans; the
    cost is a null count (free) and one min/max per time column."""
    for name in schema.REQUIRED_COLUMNS:
        nulls = table.column(name).null_count
        if nulls:
            raise DamagedFileError(f"{path}: damaged span file: {name} is null in {nulls} spans")
    if not table.num_rows:
        return
    ranges: dict[str, int] = {}
    for name in ("start_ns", "dur_ns"):
        low, high = pc.min_max(table.column(name)).values()
        if low.as_py() < 0:
            count = pc.sum(pc.less(table.column(name), 0)).as_py()
            raise DamagedFileError(
                f"{path}: damaged span file: {name} is negative in {count} spans "
                f"(as low as {low.as_py()})"
            )
        ranges[name] = high.as_py()
    if ranges["start_ns"] + ranges["dur_ns"] > _INT64_MAX:  # rare: find the spans exactly
        ends = pc.add(table.column("start_ns"), table.column("dur_ns"))  # wraps on overflow
        count = pc.sum(pc.less(ends, table.column("start_ns"))).as_py()
        if count:
            raise DamagedFileError(
                f"{path}: damaged span file: start_ns + dur_ns is past the int64 range "
                f"(an end before its start) in {count} spans"
            )


def conform(table: pa.Table, path: Path | None = None) -> pa.Table:
    """Add columns that an older writer did not know, so readers see one schema; a column of
    the wrong type is a StoreError naming the file, the column and both types."""
    columns = []
    empty = NullColumns(table.num_rows)
    for field_ in schema.SPAN_SCHEMA:
        if field_.name in table.column_names:
            column = table.column(field_.name)
            if table.num_rows and column.null_count == table.num_rows:
                # a column no span of the file sets (a link, the hardware counters): one shared
                # zeroed buffer, not 8 bytes a row (on 1M spans, 20 such columns took 160 MB)
                columns.append(empty(field_.type))
                continue
            try:
                columns.append(column.cast(field_.type))
            except (pa.ArrowException, ValueError, TypeError) as exc:
                raise StoreError(
                    f"{path or 'span table'}: column {field_.name} is {column.type}, "
                    f"expected {field_.type} ({str(exc).splitlines()[0]})"
                ) from exc
        else:
            columns.append(empty(field_.type))
    return pa.Table.from_arrays(columns, schema=schema.SPAN_SCHEMA)


def open_run(path: Path, foreign: bool = False) -> Run:
    """The run in ``path``; with ``foreign``, also the spans of a sender that is not xsp (the
    collector's ``otlp`` directories), which only export and push read."""
    meta = read_json(path / RUN_META)
    fmt = str(meta.get("format", ""))
    if fmt.split("/")[0] != schema.STORE_FORMAT.split("/")[0]:
        raise StoreError(f"{path / RUN_META}: unknown store format {fmt!r}")
    if "levels" in meta:
        levels = meta["levels"]
        if levels == FOREIGN_LEVELS:
            if foreign:
                return Run(path, meta)
            raise StoreError(
                f"{path}: spans of a sender that is not xsp (they have no xsp.levels): xsp's "
                f"analyses read xsp runs; `xsp export` and `xsp push` give them back as they "
                f"came in"
            )
        try:
            if not isinstance(levels, str):
                raise ValueError(f'expected a string such as "MF", found {levels!r}')
            LevelSet(levels)
        except ValueError as exc:
            raise StoreError(f"{path / RUN_META}: bad levels: {exc}") from exc
    return Run(path, meta)


def _listed_levels(path: Path, manifest: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(level set, status) of each run a manifest lists, checked."""
    runs = manifest.get("runs", [])
    if not isinstance(runs, list):
        raise StoreError(f"{path}: 'runs' is {type(runs).__name__}, expected a list")
    listed = []
    for index, entry in enumerate(runs):
        levels = entry.get("levels") if isinstance(entry, dict) else None
        if not isinstance(levels, str) or not levels:
            raise StoreError(f"{path}: runs[{index}] has no 'levels' (a level set such as \"MF\")")
        if Path(levels).name != levels or levels in (".", ".."):  # "../x", "/x", "a/b"
            raise StoreError(
                f"{path}: runs[{index}] has levels {levels[:80]!r}, not a directory of the "
                f'measurement (a level set such as "MF")'
            )
        if entry.get("stored") is False:
            continue  # it measured nothing and its directory was removed; the entry says why
        status = entry.get("status")
        listed.append((levels, status if isinstance(status, str) else None))
    return listed


def open_measurement(
    root: Path, warn: Callable[[str], None] | None = None, foreign: bool = False
) -> list[Run]:
    """The level-set runs of a measurement directory, in the order the manifest lists them
    (with ``foreign``, a foreign sender's spans too: ``open_run``).

    A directory that is itself one run (it holds run.json) is returned as a one-run list. What
    is left out or guessed is said through ``warn`` (default: a logged warning): a level set
    the manifest lists whose run.json is missing, one that was interrupted, runs found on disk
    that the manifest does not list (its runner was killed), or no manifest at all.
    """
    say = warn or (lambda message: log.warning("warning: %s", message))
    if not root.exists():
        raise StoreError(f"{root}: no such run directory")
    if not root.is_dir():
        raise StoreError(f"{root}: not a run directory (a file)")
    if (root / RUN_META).exists():
        return [open_run(root, foreign)]
    on_disk = sorted(
        p.parent.name for p in root.glob(f"*/{RUN_META}") if p.parent.name != RECONSTRUCTED
    )
    interrupted: list[str] = []
    if (root / MANIFEST).exists():
        record = read_json(root / MANIFEST)
        listed = _listed_levels(root / MANIFEST, record)  # checked here: its messages name it
        manifest = Manifest.from_json(record)
        names = []
        for levels, status in listed:
            if status == Status.INTERRUPTED:
                say(f"level set {levels} was interrupted; left out")
                interrupted.append(levels)
            else:
                names.append(levels)
        unlisted = [n for n in on_disk if n not in {levels for levels, _ in listed}]
        earlier = [n for n in unlisted if not _same_measurement(root / n, manifest)]
        if earlier:  # an earlier measurement into the same directory
            say(f"level set {', '.join(earlier)}: from another measurement than {root}'s; left out")
            unlisted = [n for n in unlisted if n not in earlier]
        if unlisted:
            say(
                f"{root / MANIFEST} does not list {', '.join(unlisted)} (its runner stopped "
                f"early: status {_status_text(manifest.status)!r}); read from their run.json"
            )
            names += unlisted
        elif manifest.status == Status.RUNNING:
            say(f"{root / MANIFEST} says running: the measurement is unfinished or was killed")
    else:
        names = on_disk
        if names:
            say(f"{root}: no {MANIFEST}; reading the level sets found: {', '.join(names)}")
    runs = []
    for name in names:
        if (root / name / RUN_META).exists():
            runs.append(open_run(root / name, foreign))
        else:
            missing = root / name if not (root / name).exists() else root / name / RUN_META
            say(f"level set {name}: {missing} is missing; left out")
    if not runs and interrupted:
        raise StoreError(
            f"{root}: its level sets were interrupted ({', '.join(interrupted)}); each keeps "
            f"what it stored: read one alone, as in `xsp analyze {root / interrupted[0]}`"
        )
    if not runs:
        raise StoreError(f"{root}: holds no xsp run (no */{RUN_META})")
    return runs


def _status_text(status: Status | None) -> str | None:
    return status.value if status is not None else None


def _same_measurement(run_dir: Path, manifest: Manifest) -> bool:
    """Whether the run in ``run_dir`` belongs to the measurement of ``manifest`` (runs of
    older stores, without ids, are taken as belonging)."""
    ours = manifest.measurement_id
    try:
        theirs = read_run_meta(run_dir / RUN_META).measurement_id
    except StoreError:
        return True  # open_run names the damage
    return ours is None or theirs is None or ours == theirs


def open_output(path: Path) -> TextIO:
    """A text file to write an export into, gzip-compressed when its name ends in ``.gz``."""
    if path.suffix == ".gz":
        return gzip.open(path, "wt")
    return open(path, "w")


def check_output(path: Path) -> None:
    """Refuse an output file that would replace a run store's own files (a level-set run's
    directory, or a store file's name beside a manifest), as named or where its symbolic links
    lead, a directory, or one in a directory that does not exist; the message names the path."""
    target = Path(os.path.abspath(path))
    parent = target.parent
    if target.is_dir():
        raise StoreError(f"cannot write {path}: it is a directory")
    if not parent.is_dir():
        raise StoreError(f"cannot write {path}: no such directory {parent}")
    resolved = target.resolve()  # where the bytes would go: open() follows the links
    for place in dict.fromkeys((target, resolved)):
        if _is_store_file(place):
            leads = f" (a symbolic link to {place})" if place != target else ""
            raise StoreError(
                f"refusing to write {path}{leads}: it is inside the run store {place.parent} "
                "(its files would be replaced); choose a path outside it"
            )


def _is_store_file(path: Path) -> bool:
    in_run = (path.parent / RUN_META).exists()
    store_name = any(fnmatch.fnmatch(path.name, pattern) for pattern in _STORE_NAMES)
    return in_run or (store_name and (path.parent / MANIFEST).exists())


def check_run_destination(run_dir: Path, root: Path) -> None:
    """Refuse to write a run into ``run_dir`` (a directory of the measurement ``root``) where it
    is a symbolic link, or not a directory: the run's files would be deleted and written
    wherever the link leads (another run's, another store's); the message names the path."""
    if run_dir.is_symlink():
        raise StoreError(
            f"refusing to write into {run_dir}: it is a symbolic link (to "
            f"{os.readlink(run_dir)}), not a directory of {root}; remove it"
        )
    if run_dir.exists() and not run_dir.is_dir():
        raise StoreError(f"refusing to write into {run_dir}: it is not a directory; remove it")
