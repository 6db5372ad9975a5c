"""``otlp-json``: OTLP JSON Lines, as the OpenTelemetry file exporter specifies: one trace
(iteration) per line; gzipped when the output's name ends in ``.gz``; stdout without an output.
Laid out for Jaeger's UI, which uploads such files (``xsp.tracer.export.view``: one service per
level, the layers' backward spans, short kernel names); the xsp collector stores them as stored."""

from __future__ import annotations

import sys
from pathlib import Path

from xsp.core.errors import XspError
from xsp.tracer.export.formats.base import ExportFormat, ExportSource

__all__ = ["FORMAT", "write"]


def write(source: ExportSource, output: Path | None) -> str | None:
    from xsp.core.store import open_output
    from xsp.tracer.export.sinks import OtlpJsonFileSink

    batches = source.spans()
    try:
        handle = open_output(output) if output else sys.stdout
    except OSError as exc:
        raise XspError(f"cannot write {output}: {exc.strerror or exc}") from exc
    try:
        sink = OtlpJsonFileSink(handle)
        for spans in batches:
            sink.export(spans.batch)
        sink.shutdown()
    except OSError as exc:
        raise XspError(f"cannot write {output or 'stdout'}: {exc}") from exc
    finally:
        if output:
            handle.close()
    return f"wrote {sink.lines} traces to {output}" if output else None


FORMAT = ExportFormat("otlp-json", "OTLP JSON Lines", write)
