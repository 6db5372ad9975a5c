"""Where converted spans go: one small interface, several implementations, one composite.

A sink receives ``SpanBatch`` objects (a resource plus a read-only span table)::

    export(batch)   called from the session's thread after conversion; may block
    force_flush()   push out anything buffered; may block
    shutdown()      release resources; safe to call twice

``InMemorySink`` is the test double; ``StoreSink`` writes the run store; ``OtlpSink`` sends OTLP
over a transport (HTTP or gRPC); ``CompositeSink`` fans out to several, isolating their failures.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from xsp.core import store
from xsp.core.errors import XspError
from xsp.core.otlp.json_types import StoredResourceJson

if TYPE_CHECKING:
    from xsp.core.otlp.transport import Transport

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_MAX_SPANS_PER_REQUEST",
    "CompositeSink",
    "InMemorySink",
    "OtlpJsonFileSink",
    "OtlpSink",
    "Sink",
    "SpanBatch",
    "StoreSink",
]

log = logging.getLogger(__name__)

#: Spans per OTLP request, and bytes: Jaeger's OTLP gRPC receiver refuses messages over 4 MiB.
DEFAULT_MAX_SPANS_PER_REQUEST = 8192
DEFAULT_MAX_REQUEST_BYTES = 3 * 1024 * 1024


@dataclass(frozen=True)
class SpanBatch:
    """Spans of one run with the resource they belong to. Receivers must not mutate it."""

    resource: Mapping[str, Any]
    table: pa.Table
    #: The store's name for it (``spans-<part>.parquet``): a continuous session's batch number,
    #: so that recovering a batch after a crash rewrites the same part; None: the next number.
    part: str | None = None
    #: The rest of a stored sender's resource, which the OTLP encoders give back: run.json's
    #: "resources" entry (its ``droppedAttributesCount``, ``schemaUrl``); empty for xsp's own.
    resource_extra: StoredResourceJson = field(default_factory=lambda: StoredResourceJson())

    @classmethod
    def of(
        cls,
        resource: Mapping[str, Any],
        table: pa.Table,
        part: str | None = None,
        resource_extra: StoredResourceJson | None = None,
    ) -> SpanBatch:
        return cls(
            MappingProxyType(dict(resource)),
            table,
            part,
            # a copy: the caller's later changes do not reach the batch
            resource_extra.copy() if resource_extra else {},
        )


class Sink(Protocol):
    def export(self, batch: SpanBatch) -> None: ...

    def force_flush(self) -> None: ...

    def shutdown(self) -> None: ...


@dataclass
class InMemorySink:
    """Keeps every batch in memory; for tests and for callers that post-process spans."""

    batches: list[SpanBatch] = field(default_factory=list)
    closed: bool = False

    def export(self, batch: SpanBatch) -> None:
        self.batches.append(batch)

    def force_flush(self) -> None:
        pass

    def shutdown(self) -> None:
        self.closed = True

    def table(self) -> pa.Table:
        tables = [b.table for b in self.batches]
        return pa.concat_tables(tables) if tables else pa.table({})


class StoreSink:
    """Writes each batch as one parquet part of a run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.files: list[Path] = []

    def export(self, batch: SpanBatch) -> None:
        if batch.table.num_rows:
            path = store.write_span_part(self.run_dir, batch.table, name=batch.part)
            if path not in self.files:
                self.files.append(path)

    def force_flush(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class OtlpSink:
    """Encodes batches as OTLP trace requests and sends them through a transport.

    ``view`` (the default) sends the layout for a trace viewer (``xsp.tracer.export.view``: one
    service per level, backward under its layers, short kernel names), which the xsp collector
    undoes, with each trace of more than ``max_spans_per_trace`` spans folded (``view.fold``;
    0: none); ``on_sent(spans)`` is called after each request with the stored spans it carried."""

    def __init__(
        self,
        transport: Transport,
        max_spans_per_request: int = DEFAULT_MAX_SPANS_PER_REQUEST,
        scope_version: str = "",
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        view: bool = True,
        on_sent: Callable[[int], None] | None = None,
        max_spans_per_trace: int | None = None,
    ) -> None:
        from xsp.tracer.export.view import DEFAULT_MAX_SPANS_PER_TRACE

        self._transport = transport
        self._max_spans = max_spans_per_request
        self._max_bytes = max_request_bytes
        self._scope_version = scope_version
        self._view = view
        self._on_sent = on_sent
        self._max_per_trace = (
            DEFAULT_MAX_SPANS_PER_TRACE if max_spans_per_trace is None else max_spans_per_trace
        )
        self._closed = False
        self.spans_sent = 0  # stored spans
        self.view_spans_sent = 0  # spans the viewer layout added (layers' backward spans)
        self.summaries_sent = 0  # of these, the summaries of folded spans
        self.spans_folded = 0  # stored spans folded into them (not sent)
        self.requests_sent = 0

    def export(self, batch: SpanBatch) -> None:
        from xsp.core import otlp  # here: protobuf's import is paid by OTLP users only

        table = batch.table
        if self._view:
            from xsp.tracer.export.view import for_viewer

            table = for_viewer(table, self._max_per_trace)
            self.spans_folded += batch.table.num_rows - (table.num_rows - _added_rows(table))
        for part in otlp.batches_under(table, self._max_spans):
            self._send(batch, part)

    def _send(self, batch: SpanBatch, part: pa.Table) -> None:
        from xsp.tracer.export import otlp_layout

        request = otlp_layout.encode_request(
            batch.resource, part, self._scope_version, self._view, batch.resource_extra
        )
        if request.ByteSize() > self._max_bytes and part.num_rows > 1:
            half = part.num_rows // 2  # rare: spans with very long attributes
            self._send(batch, part.slice(0, half))
            self._send(batch, part.slice(half))
            return
        self._transport.send(request)
        self.requests_sent += 1
        added = _added_rows(part)
        stored = part.num_rows - added
        self.spans_sent += stored
        self.view_spans_sent += added
        self.summaries_sent += _summary_rows(part)
        if self._on_sent is not None:
            self._on_sent(stored)

    def force_flush(self) -> None:
        pass

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self._transport.close()


def _added_rows(part: pa.Table) -> int:
    """The rows of ``part`` that a viewer layout added (not stored spans)."""
    from xsp.tracer.export.view import ADDED_COLUMN

    if ADDED_COLUMN not in part.column_names:
        return 0
    return int(pc.sum(part.column(ADDED_COLUMN).fill_null(False).cast(pa.int64())).as_py() or 0)


def _summary_rows(part: pa.Table) -> int:
    """The rows of ``part`` that summarize folded spans (``view.fold``)."""
    from xsp.tracer.export.view import FOLD_KEYS

    name = next(iter(FOLD_KEYS))
    return 0 if name not in part.column_names else part.num_rows - part.column(name).null_count


class CompositeSink:
    """Fans every call out to several sinks; one failing sink does not stop the others.

    Failures are logged and kept in ``errors``, and the sinks that failed in ``failed`` (the
    session writes them into run.json and makes the run's status say so). Any exception a sink
    raises is caught: a buggy exporter must not cost the run its store.
    """

    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = list(sinks)
        self.errors: list[str] = []
        self.failed: list[Sink] = []

    def _each(self, method: str, *args: Any) -> None:
        for sink in self.sinks:
            try:
                getattr(sink, method)(*args)
            except Exception as exc:
                detail = str(exc) if isinstance(exc, (XspError, OSError)) else repr(exc)
                message = f"{type(sink).__name__}.{method}: {detail}"
                log.error("%s", message)
                self.errors.append(message)
                if not any(s is sink for s in self.failed):
                    self.failed.append(sink)

    def export(self, batch: SpanBatch) -> None:
        self._each("export", batch)

    def force_flush(self) -> None:
        self._each("force_flush")

    def shutdown(self) -> None:
        self._each("shutdown")


class OtlpJsonFileSink:
    """Writes OTLP/JSON Lines, as the OpenTelemetry file exporter specifies: one
    ``{"resourceSpans": ...}`` request per line, here one line per trace (iteration); ``view``
    and ``max_spans_per_trace`` as ``OtlpSink``'s (Jaeger's UI uploads such files)."""

    def __init__(
        self,
        handle: Any,
        scope_version: str = "",
        view: bool = True,
        max_spans_per_trace: int | None = None,
    ) -> None:
        from xsp.tracer.export.view import DEFAULT_MAX_SPANS_PER_TRACE

        self._handle = handle
        self._scope_version = scope_version
        self._view = view
        self._max_per_trace = (
            DEFAULT_MAX_SPANS_PER_TRACE if max_spans_per_trace is None else max_spans_per_trace
        )
        self.lines = 0

    def export(self, batch: SpanBatch) -> None:
        import json

        from xsp.core import otlp
        from xsp.tracer.export import otlp_layout

        table = batch.table
        if self._view:
            from xsp.tracer.export.view import for_viewer

            table = for_viewer(table, self._max_per_trace)
        for trace in otlp.split_traces(table):
            request = otlp_layout.encode_request_json(
                batch.resource, trace, self._scope_version, self._view, batch.resource_extra
            )
            self._handle.write(json.dumps(request, separators=(",", ":")))
            self._handle.write("\n")
            self.lines += 1

    def force_flush(self) -> None:
        self._handle.flush()

    def shutdown(self) -> None:
        self.force_flush()
