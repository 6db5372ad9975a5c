"""``otlp-metrics-json``: the GPU monitor's samples as OTLP metrics (see
``xsp.tracer.export.metrics``), one JSON line per run that took samples; stdout without an
output. It reads no spans."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from xsp.core.errors import XspError
from xsp.tracer.export.formats.base import ExportFormat, ExportSource

__all__ = ["FORMAT", "write"]


def write(source: ExportSource, output: Path | None) -> str | None:
    from xsp.core.records import MonitorSamples
    from xsp.tracer.export.metrics import encode_metrics, metrics_to_json

    lines = []
    for run in source.runs:
        table = run.monitor()
        if table is None or not table.num_rows:
            continue
        columns = table.to_pydict()
        samples = MonitorSamples(time_ns=columns.pop("time_ns"), values=columns)
        request = encode_metrics(samples, run.resource)
        lines.append(json.dumps(metrics_to_json(request), separators=(",", ":")))
    if not lines:
        where = source.runs[0].path.parent if source.runs else "the export"
        raise XspError(f"no GPU monitor samples in {where} (CPU runs have none)")
    text = "\n".join(lines) + "\n"
    if output is None:
        sys.stdout.write(text)
        return None
    try:
        output.write_text(text)
    except OSError as exc:
        raise XspError(f"cannot write {output}: {exc}") from exc
    return f"wrote the monitor metrics of {len(lines)} runs to {output}"


FORMAT = ExportFormat(
    "otlp-metrics-json", "the GPU monitor's samples as OTLP metrics, one line per run", write
)
