"""Received OTLP requests -> the run store, in the same layout embedded mode writes.

Spans are grouped by their resource: ``STORE/<measurement>/<levels>/`` where the measurement is
``xsp.measurement.id`` (else ``xsp.run.id``, else ``service.name``) and the level set is
``xsp.levels`` (else ``otlp``). Each flushed spool segment becomes one parquet part per run,
named after the segment, so replaying a segment after a crash rewrites the same files.

Conversion (``convert``, one request at a time) is separate from writing, so the flusher can set
aside the one request that fails to convert and store the rest of its segment.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tracer import otlp, schema, store
from tracer.errors import StoreError

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
FALLBACK_LEVELS = "otlp"


def _safe(name: str) -> str:
    cleaned = _UNSAFE.sub("_", name).strip("._")[:100]
    return cleaned or "unknown"


def run_key(resource: dict[str, Any]) -> tuple[str, str]:
    measurement = (
        resource.get(schema.RES_MEASUREMENT_ID)
        or resource.get(schema.RES_RUN_ID)
        or resource.get(schema.RES_SERVICE_NAME)
        or "unknown"
    )
    levels = resource.get(schema.RES_LEVELS) or FALLBACK_LEVELS
    return _safe(str(measurement)), _safe(str(levels))


#: One converted request: (run key, resource attributes, span rows) per run it touches.
Converted = list[tuple[tuple[str, str], dict[str, Any], pa.Table]]


def convert(request: ExportTraceServiceRequest) -> Converted:
    """The store rows of one request, by run; raises whatever conversion raises (a poison
    request the caller quarantines)."""
    out: Converted = []
    for resource_spans in request.resource_spans:
        resource = otlp.resource_attributes(resource_spans)
        table = otlp.table_from_resource_spans(resource_spans)
        if table.num_rows:
            out.append((run_key(resource), resource, table))
    return out


class StoreWriter:
    """Writes batches of converted requests into the store; used by the collector's one flusher
    (it blocks on the disk)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the store {self.root}: {exc}") from exc
        self.spans_written = 0

    def write(self, part_name: str, converted: Iterable[Converted]) -> int:
        groups: dict[tuple[str, str], tuple[dict[str, Any], list[pa.Table]]] = {}
        for request in converted:
            for key, resource, table in request:
                groups.setdefault(key, (resource, []))[1].append(table)
        written = 0
        for (measurement, levels), (resource, tables) in groups.items():
            run_dir = self.root / measurement / levels
            table = pa.concat_tables(tables, promote_options="permissive")
            store.write_span_part(run_dir, table, name=part_name)
            try:
                self._update_meta(run_dir, measurement, levels, resource)
            except OSError as exc:
                raise StoreError(f"cannot write {run_dir / store.RUN_META}: {exc}") from exc
            written += table.num_rows
        self.spans_written += written
        return written

    def _update_meta(
        self, run_dir: Path, measurement: str, levels: str, resource: dict[str, Any]
    ) -> None:
        spans = sum(
            pq.ParquetFile(p).metadata.num_rows for p in run_dir.glob(store.SPAN_FILE_PATTERN)
        )
        store.write_json_atomic(
            run_dir / store.RUN_META,
            {
                "format": schema.STORE_FORMAT,
                "run_id": resource.get(schema.RES_RUN_ID, measurement),
                "measurement_id": measurement,
                "levels": levels,
                "workload": resource.get(schema.RES_WORKLOAD),
                "resource": resource,
                "status": "collected",
                "spans": spans,
                "source": "collector",
            },
        )
