"""``chrome``: one Chrome/Perfetto trace file in torch.profiler's layout (see
``xsp.tracer.export.chrome``); the ranks of a multi-rank run are processes of their own, with
their own pids. It needs an output file (gzipped when its name ends in ``.gz``)."""

from __future__ import annotations

from pathlib import Path

from xsp.core.errors import XspError
from xsp.tracer.export.formats.base import ExportFormat, ExportSource

__all__ = ["FORMAT", "FORMAT_NS", "write", "write_exact_ns"]


def write(source: ExportSource, output: Path | None, exact_ns: bool = False) -> str | None:
    from xsp.tracer.export.chrome import split_ranks, write_chrome_trace

    batches = source.spans()
    if output is None:
        raise XspError("--format chrome needs -o FILE (a .json or .json.gz file)")
    parts = [
        part
        for spans in batches
        for part in split_ranks(spans.batch.resource, spans.batch.table, spans.rank_pids)
    ]
    try:
        count = write_chrome_trace(output, parts, exact_ns)
    except OSError as exc:
        raise XspError(f"cannot write {output}: {exc}") from exc
    return f"wrote {count} spans to {output}"


def write_exact_ns(source: ExportSource, output: Path | None) -> str | None:
    return write(source, output, exact_ns=True)


FORMAT = ExportFormat(
    "chrome",
    "Chrome/Perfetto trace JSON in torch.profiler's layout, in whole microseconds, which "
    "Holistic Trace Analysis reads with its defaults (gzip with -o *.gz)",
    write,
)
FORMAT_NS = ExportFormat(
    "chrome-ns",
    "the same, exact to the nanosecond (for Perfetto; HTA needs HTA_DISABLE_NS_ROUNDING=1)",
    write_exact_ns,
)
