"""Received OTLP requests -> the run store, in the same layout embedded mode writes.

Spans are grouped by their resource: ``STORE/<measurement>/<levels>/`` where the measurement is
``xsp.measurement.id`` (else ``xsp.run.id``, else ``service.name``) and the level set is
``xsp.levels`` (else ``otlp``). Each flushed spool segment becomes one parquet part per run,
named after the segment, so replaying a segment after a crash rewrites the same files.

Conversion (``convert``, one request at a time) is separate from writing, so the flusher can set
aside the one request that fails to convert and store the rest of its segment. A request's
consecutive senders of one run make one table (a request of many senders costs a table per run,
not per sender: one per sender, concatenated, stored 5x slower).

The same span is never stored twice in a run directory within the dedupe window: before a batch
is written, the spans whose (trace_id, span_id) the directory's newest parts (about its newest
``config.collector_dedupe_spans()`` spans) already store, or that come earlier in the batch, are
dropped and counted (a sender that pushes one run twice, over two protocols, or across a
collector restart). A copy older than the window is stored again: the index stays bounded.
Algorithm:

1. Each run directory written in this process has a ``SpanKeys`` index: the sorted 64-bit hashes
   of the keys its newest parts hold, read once from their two key columns and then extended as
   parts are written, the oldest dropped a generation (a window's spans) at a time. The
   ``MAX_INDEXED_RUNS`` most recently written directories keep theirs, within a total of
   ``config.collector_dedupe_index_bytes()`` (the least recently written dropped first, the one
   being written always kept); an evicted one is read again when next written.
2. A span whose hash is absent from the index (and unique in its batch) is new: one vectorised
   ``searchsorted`` per sorted run of hashes, the whole cost of the normal path.
3. Only spans whose hash hits are compared exactly, against the keys read back from the parts,
   so a 64-bit collision never drops a span that is not stored.
4. A part being rewritten (a segment replayed after a crash) is left out of the index, so its
   own earlier copy never counts as already stored.
5. Parts that another process wrote into the directory since (another collector replica on the
   same store) are indexed as they appear, before each write: replicas de-duplicate against each
   other's parts as against their own. run.json is rewritten until the parts it counts are the
   ones on disk, so the last replica to write a directory leaves its full count.
6. On an object store (``mirror``: ``object_mirror.ObjectMirror``) the directory is a local
   working copy: the other replicas' parts are downloaded into it before it is listed (in 1 and
   5), and a run's new part and run.json are uploaded before ``write`` returns.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans

from xsp.collector import span_columns
from xsp.collector.object_mirror import ObjectMirror
from xsp.core import config, schema, store
from xsp.core.errors import StoreError
from xsp.core.otlp import columns as otlp_columns
from xsp.core.otlp.decode import (
    parse_protobuf,
    plain_resource,
    resource_attributes,
    resource_id,
    resource_json,
    table_from_resource_spans,
)
from xsp.core.otlp.json_types import AttributeValue, StoredResourceJson
from xsp.core.store import RunMeta, Status

__all__ = [
    "COLLECTOR",
    "FALLBACK_LEVELS",
    "MAX_INDEXED_RUNS",
    "TOGETHER_SPANS",
    "UNIDENTIFIED",
    "Converted",
    "Run",
    "Sender",
    "SpanKeys",
    "StoreWriter",
    "convert",
    "convert_together",
    "drop_stored",
    "key_hashes",
    "note_quarantined",
    "run_key",
    "unsafe_destination",
]

log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
FALLBACK_LEVELS = store.FOREIGN_LEVELS
#: Run directories whose key index stays in memory (8-16 bytes a window span each), at most;
#: their total bytes are bounded too (``config.collector_dedupe_index_bytes``).
MAX_INDEXED_RUNS = 64
#: What a part's entries in an index cost beside its hashes (its name and counts in dicts).
PART_ENTRY_BYTES = 256
#: run.json's ``source`` of a run the collector stored
COLLECTOR = "collector"
_KEY_COLUMNS = ["trace_id", "span_id"]
#: Spans decoded in one go: enough that numpy's and arrow's cost per call is small, few enough
#: that the decoder's arrays stay in the CPU's cache (measured: 8-32 requests of 1,000 spans
#: fastest, all 100 of a segment 2x slower).
TOGETHER_SPANS = 16384


def _safe(name: str) -> str:
    """A directory name for ``name``: itself when it is already one (only ``[A-Za-z0-9_.-]``, no
    leading/trailing ``.``/``_``, at most 100 characters), else a cleaned prefix plus ``~`` and a
    hash of the whole name. ``~`` never survives cleaning, so two different names never share a
    directory (``a/b`` -> ``a_b~…``, ``a_b`` -> ``a_b``)."""
    cleaned = _UNSAFE.sub("_", name).strip("._")[:100]
    if cleaned == name and name:
        return name
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return f"{cleaned[:80]}~{digest}"


#: The directory of spans whose resource names no measurement, run or service. ``_safe`` never
#: makes it (its only ``~`` is followed by 16 hex digits), so a measurement really called
#: ``unknown`` or ``unidentified`` keeps a directory of its own.
UNIDENTIFIED = "~unidentified"


def run_key(resource: Mapping[str, AttributeValue]) -> tuple[str, str]:
    measurement = (
        resource.get(schema.RES_MEASUREMENT_ID)
        or resource.get(schema.RES_RUN_ID)
        or resource.get(schema.RES_SERVICE_NAME)
    )
    levels = resource.get(schema.RES_LEVELS) or FALLBACK_LEVELS
    return _safe(str(measurement)) if measurement else UNIDENTIFIED, _safe(str(levels))


class Sender(NamedTuple):
    """A resource as stored: its id (``resource_id``, the spans' ``resource_id``), its
    attributes as plain values (run.json's "resource") and typed (``resources-<part>.parquet``)."""

    id: str
    attributes: dict[str, AttributeValue]
    typed: StoredResourceJson


class Run(NamedTuple):
    """A request's spans for one run directory: its key, the senders they come from (those
    with spans, in the request's order) and their rows."""

    key: tuple[str, str]
    senders: tuple[Sender, ...]
    table: pa.Table


#: One converted request: a ``Run`` per run it touches, consecutive resources of the same run
#: together (a request of many senders is one table a run, not one a sender).
Converted = list[Run]


def convert(request: ExportTraceServiceRequest | Any) -> Converted:
    """The store rows of one request (OTLP's message, or ``otlp_columns.parse_request``'s
    mirror of it, decoded column-wise), by run; raises whatever conversion raises (a poison
    request the caller quarantines)."""
    out: list[tuple[tuple[str, str], list[Sender], list[pa.Table]]] = []
    for resource_spans in request.resource_spans:
        sender = _sender(resource_spans)
        decode = (
            table_from_resource_spans
            if isinstance(resource_spans, ResourceSpans)
            else otlp_columns.table_from_resource_spans
        )
        table = decode(resource_spans, sender.id)
        if not table.num_rows:
            continue
        key = run_key(sender.attributes)
        if not out or out[-1][0] != key:
            out.append((key, [], []))
        out[-1][1].append(sender)
        out[-1][2].append(table)
    return [Run(key, tuple(senders), _concat(tables)) for key, senders, tables in out]


def _concat(tables: list[pa.Table]) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive").combine_chunks()


def convert_together(requests: list[Any]) -> list[Converted] | None:
    """``convert`` of each of ``otlp_columns``' mirrors of requests, decoded together about
    ``TOGETHER_SPANS`` spans at a time (numpy's and arrow's cost per call paid once for many
    requests); None where one is not all xsp's common case or fails (convert each alone then,
    to find the one that fails)."""
    out: list[Converted] = []
    batch: list[Any] = []
    spans = 0
    for index, request in enumerate(requests):
        batch.append(request)
        spans += sum(len(s.spans) for rs in request.resource_spans for s in rs.scope_spans)
        if spans >= TOGETHER_SPANS or index == len(requests) - 1:
            converted = _convert_together(batch)
            if converted is None:
                return None
            out.extend(converted)
            batch, spans = [], 0
    return out


def _convert_together(requests: list[Any]) -> list[Converted] | None:
    try:
        senders = [[_sender(rs) for rs in request.resource_spans] for request in requests]
        blocks = [
            otlp_columns.block(rs, sender.id)
            for request, ids in zip(requests, senders, strict=True)
            for rs, sender in zip(request.resource_spans, ids, strict=True)
        ]
        each = iter(blocks)
        runs = [_runs_of(ids, each) for ids in senders]
        groups = [len(members) for request in runs for _, members in request]
        tables = otlp_columns.tables_of_blocks(blocks, span_columns.decode, groups)
    except Exception:  # each request alone then says which one fails, and why
        return None
    if tables is None:
        return None
    out: list[Converted] = []
    at = iter(tables)
    for request in runs:
        out.append([])
        for key, members in request:
            table = next(at)
            if table.num_rows:
                having = tuple(sender for sender, spans in members if spans)
                out[-1].append(Run(key, having, table))
    return out


def _runs_of(
    senders: list[Sender], blocks: Iterator[otlp_columns.Block]
) -> list[tuple[tuple[str, str], list[tuple[Sender, int]]]]:
    """A request's senders grouped as ``convert`` groups them: consecutive ones of the same
    run, each with its count of spans (from ``blocks``, read on to this request's)."""
    runs: list[tuple[tuple[str, str], list[tuple[Sender, int]]]] = []
    for sender in senders:
        spans = len(next(blocks).spans)  # a sender without spans joins the run it is in
        key = run_key(sender.attributes)
        if not runs or (spans and runs[-1][0] != key):
            if runs and not any(count for _, count in runs[-1][1]):
                runs[-1] = (key, runs[-1][1])  # only senders without spans so far
            else:
                runs.append((key, []))
        runs[-1][1].append((sender, spans))
    return runs


def _sender(resource_spans: Any) -> Sender:
    typed = resource_json(resource_spans)
    return Sender(resource_id(typed), plain_resource(typed), typed)


def unsafe_destination(root: Path, runs: Iterable[tuple[str, str]]) -> str | None:
    """Why the run directories ``root/measurement/levels`` of ``runs`` cannot be written: one,
    or the measurement directory above it, is a symbolic link or not a directory (planted in a
    shared store, it would lead the writes out of the store); None where all can."""
    for measurement, levels in runs:
        for path in (root / measurement, root / measurement / levels):
            try:
                store.check_run_destination(path, root)
            except StoreError as exc:
                return str(exc)
    return None


# -- span keys -------------------------------------------------------------------------------------
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    # splitmix64's finaliser: every input bit reaches every output bit
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def key_hashes(table: pa.Table) -> np.ndarray:
    """A 64-bit hash of each row's (trace_id, span_id), vectorised (no per-row Python)."""
    trace = table.column("trace_id").combine_chunks()
    if trace.null_count:
        trace = pc.fill_null(trace, b"\0" * 16)
    trace = trace.cast(pa.binary(16))
    words = np.frombuffer(trace.buffers()[1], dtype="<u8")
    words = words[2 * trace.offset : 2 * (trace.offset + len(trace))].reshape(-1, 2)
    span = table.column("span_id").cast(pa.uint64()).fill_null(0).to_numpy()
    return _mix(words[:, 0] ^ _mix(words[:, 1] ^ _mix(span.astype(np.uint64, copy=False))))


def _exact_keys(table: pa.Table, rows: np.ndarray) -> list[tuple[bytes | None, int | None]]:
    picked = table.select(_KEY_COLUMNS).take(pa.array(rows, pa.int64()))
    traces = picked.column("trace_id").to_pylist()
    spans = picked.column("span_id").to_pylist()
    return list(zip(traces, spans, strict=True))


class _Generation:
    """Some consecutive parts' hashes: a few sorted arrays, merged like a binary counter, so
    adding a part costs about its own size and a lookup a few binary searches."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.spans = 0
        self.sorted: list[np.ndarray] = []

    def add(self, part: str, hashes: np.ndarray) -> None:
        self.parts.append(part)
        self.spans += len(hashes)
        if len(hashes):
            self.sorted.append(np.sort(hashes))
        while len(self.sorted) > 1 and len(self.sorted[-2]) <= 2 * len(self.sorted[-1]):
            newer = self.sorted.pop()
            self.sorted[-1] = np.sort(np.concatenate([self.sorted[-1], newer]), kind="stable")


class SpanKeys:
    """The keys one run directory stores, within the dedupe window: the hashes of its newest
    parts in two generations (the current one and the one before it), the row count of every
    part and the duplicates each skipped. A generation is closed when it would pass ``window``
    spans and the one before it is then dropped, so the index always holds the newest part and
    every part with at most ``window`` spans in it and after it, and never more than
    ``2 * window`` hashes plus one part's (8 bytes each)."""

    def __init__(self, run_dir: Path, window: int | None = None) -> None:
        self.run_dir = run_dir
        self.window = config.collector_dedupe_spans() if window is None else window
        self.parts: dict[str, int] = {}  # part name -> rows, every part
        self.skipped: dict[str, int] = {}  # part name -> duplicates left out when it was written
        self._generations = [_Generation()]  # older first, at most two

    @classmethod
    def load(
        cls, run_dir: Path, names: Iterable[str], skipped: dict[str, int], window: int | None = None
    ) -> SpanKeys:
        """Read the key columns of the newest parts of ``names`` that the window holds (part
        names sort oldest first), and the row counts of the older ones."""
        keys = cls(run_dir, window)
        keys.skipped = dict(skipped)
        newest: list[tuple[str, np.ndarray]] = []
        indexed = 0
        for name in sorted(names, reverse=True):
            path = _part_path(run_dir, name)
            if newest and indexed >= keys.window:
                keys.parts[name] = _rows(path)
                continue
            table = _read_keys(path)
            keys.parts[name] = table.num_rows
            newest.append((name, key_hashes(table)))
            indexed += table.num_rows
        for name, hashes in reversed(newest):
            keys._index(name, hashes)
        keys.parts = dict(sorted(keys.parts.items()))
        return keys

    @property
    def spans(self) -> int:
        return sum(self.parts.values())

    @property
    def indexed(self) -> list[str]:
        """The parts whose hashes the index holds, oldest first."""
        return [name for generation in self._generations for name in generation.parts]

    @property
    def hashes(self) -> int:
        return sum(generation.spans for generation in self._generations)

    @property
    def nbytes(self) -> int:
        """The memory the index holds: its hashes' arrays and an entry per part."""
        arrays = sum(a.nbytes for generation in self._generations for a in generation.sorted)
        return arrays + PART_ENTRY_BYTES * (len(self.parts) + len(self.skipped))

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        """Which of ``hashes`` the index holds (a hash hit: maybe a collision)."""
        hit = np.zeros(len(hashes), dtype=bool)
        for generation in self._generations:
            for known in generation.sorted:
                at = np.searchsorted(known, hashes)
                at[at == len(known)] = 0
                hit |= known[at] == hashes
        return hit

    def add(self, part: str, hashes: np.ndarray, rows: int | None, skipped: int) -> None:
        """Record a part just written (``rows`` None: none was, all its spans were stored)."""
        if rows is not None:
            self.parts[part] = rows
        self.skipped.pop(part, None)  # a part rewritten replaces its count
        if skipped:
            self.skipped[part] = skipped
        if rows is not None:
            self._index(part, hashes)

    def catch_up(self, names: Iterable[str], skipped: Mapping[str, int]) -> None:
        """Index the parts ``names`` that another process wrote since (oldest first), with the
        duplicates their writer counted (``skipped``, from run.json)."""
        for name in sorted(names):
            table = _read_keys(_part_path(self.run_dir, name))
            self.add(name, key_hashes(table), table.num_rows, skipped.get(name, 0))

    def _index(self, part: str, hashes: np.ndarray) -> None:
        current = self._generations[-1]
        if current.spans and current.spans + len(hashes) > self.window:
            self._generations = [current, _Generation()]  # the older one's hashes are dropped
        self._generations[-1].add(part, hashes)

    def stored_keys(self, hashes: np.ndarray) -> set[tuple[bytes | None, int | None]]:
        """The exact keys the indexed parts store whose hash is among ``hashes`` (the slow path,
        for hash hits only: it reads the parts' key columns back)."""
        found: set[tuple[bytes | None, int | None]] = set()
        for name in self.indexed:
            table = _read_keys(_part_path(self.run_dir, name))
            rows = np.flatnonzero(np.isin(key_hashes(table), hashes))
            if len(rows):
                found.update(_exact_keys(table, rows))
        return found


def drop_stored(table: pa.Table, keys: SpanKeys) -> tuple[pa.Table, np.ndarray, int]:
    """``table`` without the spans ``keys`` already stores or that come earlier in the table;
    returns the rows kept, their hashes and how many were dropped."""
    hashes = key_hashes(table)
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    repeated = np.zeros(len(hashes), dtype=bool)  # hash shared with another row of the batch
    same = ordered[1:] == ordered[:-1]
    repeated[order[1:][same]] = True
    repeated[order[:-1][same]] = True
    stored_hit = np.empty(len(hashes), dtype=bool)
    stored_hit[order] = keys.contains(ordered)  # sorted lookups: 4x fewer cache misses
    suspects = np.flatnonzero(repeated | stored_hit)
    if not len(suspects):  # the normal path: every span is new
        return table, hashes, 0
    stored = keys.stored_keys(hashes[stored_hit]) if stored_hit.any() else set()
    keep = np.ones(len(hashes), dtype=bool)
    seen: set[tuple[bytes | None, int | None]] = set()
    for row, key in zip(suspects, _exact_keys(table, suspects), strict=True):
        if key in stored or key in seen:
            keep[row] = False
        seen.add(key)
    dropped = int(len(keep) - keep.sum())
    if not dropped:
        return table, hashes, 0
    return table.filter(pa.array(keep)), hashes[keep], dropped


def _read_keys(path: Path) -> pa.Table:
    """The key columns of one part; one that cannot be read counts as holding no span (its
    spans may then be stored again, never lost)."""
    try:
        return store.read_parquet(path, "span", columns=_KEY_COLUMNS)
    except StoreError as exc:
        log.warning("xsp collector: cannot read the span keys: %s", exc)
        return pa.table(
            {"trace_id": pa.array([], pa.binary(16)), "span_id": pa.array([], pa.uint64())}
        )


def _rows(path: Path) -> int:
    """The spans of a part outside the window, from its footer alone (0 where unreadable, as
    ``_read_keys``)."""
    try:
        with pq.ParquetFile(path) as parquet:
            return int(parquet.metadata.num_rows)
    except (OSError, pa.ArrowException) as exc:
        log.warning("xsp collector: cannot read the span count of %s: %s", path, exc)
        return 0


def _part_path(run_dir: Path, name: str) -> Path:
    return run_dir / f"spans-{name}.parquet"


def _part_names(run_dir: Path) -> set[str]:
    prefix, suffix = len("spans-"), len(".parquet")
    return {p.name[prefix:-suffix] for p in run_dir.glob(store.SPAN_FILE_PATTERN)}


#: run.json is rewritten at most this many times a write while other replicas add parts (each
#: replica's next write counts the rest).
_META_ROUNDS = 4


class StoreWriter:
    """Writes batches of converted requests into the store, each span once per run directory;
    used by the collector's one flusher (it blocks on the disk), in one process at a time."""

    def __init__(
        self,
        root: Path,
        max_indexed_runs: int = MAX_INDEXED_RUNS,
        dedupe_window: int | None = None,
        max_index_bytes: int | None = None,
        mirror: ObjectMirror | None = None,
    ) -> None:
        self.root = Path(root)
        #: the object store that ``root`` is the working copy of (None: ``root`` is the store)
        self.mirror = mirror
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the store {self.root}: {exc}") from exc
        self.spans_written = 0
        self.duplicate_spans = 0  # spans left out because their run already stored them
        self._max_indexed = max_indexed_runs
        #: spans per run directory whose keys are indexed (``config.collector_dedupe_spans``)
        self.dedupe_window = (
            config.collector_dedupe_spans() if dedupe_window is None else dedupe_window
        )
        #: the most bytes the indexes of all run directories hold together
        self.max_index_bytes = (
            config.collector_dedupe_index_bytes() if max_index_bytes is None else max_index_bytes
        )
        self._indexes: OrderedDict[Path, SpanKeys] = OrderedDict()  # least recently written first

    def write(self, part_name: str, converted: Iterable[Converted]) -> int:
        """Write one part per run; returns the spans written (duplicates left out, counted in
        ``duplicate_spans`` and the run's run.json). On an object store each run's part and
        run.json are uploaded before the next run is written (a failure raises StoreError)."""
        groups: dict[tuple[str, str], tuple[dict[str, Sender], list[pa.Table]]] = {}
        for request in converted:
            for key, run_senders, table in request:
                senders, tables = groups.setdefault(key, ({}, []))
                for sender in run_senders:
                    senders.setdefault(sender.id, sender)
                tables.append(table)
        written = 0
        for (measurement, levels), (senders, tables) in groups.items():
            run_dir = self.root / measurement / levels
            table = pa.concat_tables(tables, promote_options="permissive")
            keys = self._keys(run_dir, part_name)
            table, hashes, dropped = drop_stored(table, keys)
            rows = None
            if table.num_rows or _part_path(run_dir, part_name).exists():
                typed = {sender.id: sender.typed for sender in senders.values()}
                store.write_resource_part(run_dir, part_name, typed)  # before the spans naming them
                store.write_span_part(run_dir, table, name=part_name)
                rows = table.num_rows
            keys.add(part_name, hashes, rows, dropped)
            self._fit()
            try:
                for _ in range(_META_ROUNDS):  # until no other replica's part appeared meanwhile
                    self._update_meta(run_dir, (measurement, levels), part_name, senders, keys)
                    if not self._catch_up(run_dir, keys):
                        break
            except OSError as exc:
                raise StoreError(f"cannot write {run_dir / store.RUN_META}: {exc}") from exc
            if self.mirror is not None:
                self.mirror.push(run_dir, part_name if rows is not None else None)
            written += table.num_rows
            self.duplicate_spans += dropped
        self.spans_written += written
        return written

    def _keys(self, run_dir: Path, part_name: str) -> SpanKeys:
        """The index of what ``run_dir`` stores apart from ``part_name`` (about to be written):
        the cached one while it matches the parts on disk, else read from them."""
        if self.mirror is not None:
            self.mirror.pull(run_dir)
        names = _part_names(run_dir) if run_dir.is_dir() else set()
        keys = self._indexes.pop(run_dir, None)
        if keys is None or not set(keys.parts) <= names or part_name in names:
            names.discard(part_name)
            skipped = _skipped_by_part(run_dir)
            skipped.pop(part_name, None)  # about to be counted again
            keys = SpanKeys.load(run_dir, names, skipped, self.dedupe_window)
        elif names != set(keys.parts):  # another replica's parts, written since
            keys.catch_up(names - set(keys.parts), _skipped_by_part(run_dir))
        self._indexes[run_dir] = keys
        self._fit()
        return keys

    def _catch_up(self, run_dir: Path, keys: SpanKeys) -> bool:
        """Index the parts another replica wrote into ``run_dir`` since ``keys`` was read;
        returns whether there were any."""
        if self.mirror is not None:
            self.mirror.pull(run_dir)
        new = _part_names(run_dir) - set(keys.parts)
        if new:
            keys.catch_up(new, _skipped_by_part(run_dir))
        return bool(new)

    @property
    def index_bytes(self) -> int:
        """The bytes the indexes kept hold together."""
        return sum(keys.nbytes for keys in self._indexes.values())

    def _fit(self) -> None:
        """Drop the least recently written indexes beyond ``MAX_INDEXED_RUNS`` directories or
        ``max_index_bytes`` in all; the newest (the one being written) stays whatever its size."""
        total = self.index_bytes
        while len(self._indexes) > 1 and (
            len(self._indexes) > self._max_indexed or total > self.max_index_bytes
        ):
            _, dropped = self._indexes.popitem(last=False)
            total -= dropped.nbytes

    def _update_meta(
        self,
        run_dir: Path,
        run: tuple[str, str],
        part_name: str,
        senders: dict[str, Sender],
        keys: SpanKeys,
    ) -> None:
        """run.json: the first sender's attributes in "resource" (every sender's resource is in
        the parts' ``resources-<part>.parquet``, by id as the spans' ``resource_id`` names them;
        an older collector's "resources" stay as they are)."""
        measurement, levels = run
        earlier = _read_meta(run_dir) or RunMeta()
        for name, count in (earlier.duplicate_spans_skipped_by_part or {}).items():
            if name != part_name and isinstance(count, int):  # another replica's, kept
                keys.skipped.setdefault(str(name), count)
        first = next(iter(senders.values()))
        resource = earlier.resource
        if resource is None or (earlier.resources is None and not earlier.resources_in_parts):
            resource = first.attributes  # a run.json of an older collector: its first sender's
        run_id = str(resource.get(schema.RES_RUN_ID, measurement))
        workload = resource.get(schema.RES_WORKLOAD)
        workload = None if workload is None else str(workload)
        meta = RunMeta(
            format=schema.STORE_FORMAT,
            run_id=run_id,
            measurement_id=measurement,
            levels=levels,
            workload=workload,
            resource=resource,
            resources=earlier.resources,
            resources_in_parts=True,
            status=Status.COLLECTED,
            spans=keys.spans,
            duplicate_spans_skipped=sum(keys.skipped.values()),
            duplicate_spans_skipped_by_part=dict(sorted(keys.skipped.items())),
            source=COLLECTOR,
            quarantined_requests=earlier.quarantined_requests,
            quarantined=earlier.quarantined,
            # said even where the sender did not say them
            nulls=frozenset(
                k for k, v in (("run_id", run_id), ("workload", workload)) if v is None
            ),
        )
        store.write_run_meta(run_dir / store.RUN_META, meta)


def note_quarantined(
    root: Path, payload: bytes, item: str, mirror: ObjectMirror | None = None
) -> list[Path]:
    """Count a request set aside in the quarantine (``item``, its file name there) in the
    run.json of each run it would have been stored in, where its resources can be read;
    returns the run directories whose run.json it rewrote. On an object store (``mirror``) the
    run's run.json is fetched first (another replica may have written the run) and uploaded
    after; where either fails, the count stays in the working copy and goes up with the run's
    next write (``ObjectMirror.pull`` keeps it)."""
    written: list[Path] = []
    try:
        request = parse_protobuf(payload)
        keys = {run_key(resource_attributes(rs)) for rs in request.resource_spans}
    except Exception:  # unreadable: the collector's own count and log line still say it
        return written
    for measurement, levels in sorted(keys):
        run_dir = root / measurement / levels
        if unsafe_destination(root, [(measurement, levels)]) is not None:
            continue  # counted in the collector's log line only: never written through a link
        fetched = _fetch_meta(mirror, run_dir, item)
        try:
            _count_quarantined(run_dir, (measurement, levels), item)
        except OSError as exc:
            log.error("xsp collector: cannot count %s in %s: %s", item, run_dir, exc)
            continue
        written.append(run_dir)
        if mirror is not None and fetched:
            try:
                mirror.push(run_dir)  # run.json alone: the parts are the writer's
            except (StoreError, OSError) as exc:
                log.warning("xsp collector: %s (the run's next write sends it)", exc)
    return written


def _fetch_meta(mirror: ObjectMirror | None, run_dir: Path, item: str) -> bool:
    """The run's run.json on the object store into the working copy (merged with its own
    counts); whether run.json may be uploaded after (not where it could not be fetched: the
    working copy's may lack what another replica wrote)."""
    if mirror is None:
        return False
    try:
        mirror.pull(run_dir, meta=True)
    except (StoreError, OSError) as exc:
        log.warning("xsp collector: %s (%s is counted with the run's next write)", exc, item)
        return False
    return True


def _count_quarantined(run_dir: Path, run: tuple[str, str], item: str) -> None:
    measurement, levels = run
    meta = _read_meta(run_dir) or RunMeta(
        format=schema.STORE_FORMAT,
        measurement_id=measurement,
        levels=levels,
        status=Status.COLLECTED,
        spans=0,
        source=COLLECTOR,
    )
    meta = dataclasses.replace(
        meta,
        quarantined_requests=(meta.quarantined_requests or 0) + 1,
        quarantined=(*(meta.quarantined or ()), item),
    )
    store.write_run_meta(run_dir / store.RUN_META, meta)


def _read_meta(run_dir: Path) -> RunMeta | None:
    try:
        return store.read_run_meta(run_dir / store.RUN_META)
    except StoreError:
        return None


def _skipped_by_part(run_dir: Path) -> dict[str, int]:
    """The duplicates each part left out, as an earlier process recorded them in run.json."""
    meta = _read_meta(run_dir)
    by_part = meta.duplicate_spans_skipped_by_part if meta is not None else None
    return {str(k): int(v) for k, v in (by_part or {}).items() if isinstance(v, int)}
