"""The interface of an export format: a name, a line of help, and a write function.

A format writes what an ``ExportSource`` holds into one output (a file, or stdout where the
format allows it)::

    write(source, output) -> str | None   returns one line saying what it wrote (None on stdout);
                                          raises XspError naming the output it cannot write

The CLI (``xsp export``), a script that traced with a session (``ExportSource.of_runs`` over
its run directory) and anything that reads a run store (the collector's) call the same units.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # the registry is read when the CLI starts: keep it free of pyarrow
    import pyarrow as pa

    from xsp.core.otlp.json_types import StoredResourceJson
    from xsp.core.store import Run, RunMeta
    from xsp.tracer.export.sinks import SpanBatch

__all__ = ["ExportFormat", "ExportSource", "RunSpans", "by_sender", "rank_pids"]


@dataclass(frozen=True)
class RunSpans:
    """One batch of spans to write: a run's resource and span table, and the OS pid of each of
    its ranks (rank -> pid; empty for a single process or a reconstruction)."""

    batch: SpanBatch
    rank_pids: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportSource:
    """What a format writes from.

    ``runs``: the level-set runs read from the store (their metadata, their monitor samples).
    ``spans``: builds the span batches to write, each run's own or one reconstruction; only the
    formats that write spans call it, so that nothing else pays for reading or rebuilding them.
    """

    runs: Sequence[Run]
    spans: Callable[[], Sequence[RunSpans]]

    @classmethod
    def of_runs(cls, runs: Sequence[Run]) -> ExportSource:
        """Each run's own spans, with the OS pids of its ranks."""

        def spans() -> list[RunSpans]:
            return [
                RunSpans(batch, rank_pids(r.document))
                for r in runs
                for batch in by_sender(r.resources, r.resource, r.spans())
            ]

        return cls(runs, spans)


@dataclass(frozen=True)
class ExportFormat:
    """One export format: its name (``--format NAME``), one line of help, its write function."""

    name: str
    help: str
    write: Callable[[ExportSource, Path | None], str | None]


def rank_pids(meta: RunMeta) -> dict[int, int]:
    """Rank -> OS pid of a multi-rank run (its run.json's ``ranks``)."""
    return {
        int(rank["rank"]): pid
        for rank in meta.ranks or ()
        if isinstance(pid := rank.get("pid"), int)
    }


def by_sender(
    senders: Mapping[str, Any] | None, resource: Mapping[str, Any], table: pa.Table
) -> list[SpanBatch]:
    """A run's spans by the resource that sent them (``senders``: ``Run.resources``, each
    sender's as the collector stored it, named by the spans' ``resource_id``), each value with its type and
    the rest of the resource (its dropped count, schema URL) beside; spans that name none keep
    the run's ``resource``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from xsp.core import otlp
    from xsp.tracer.export.sinks import SpanBatch

    def sent_by(entry: Any, rows: pa.Table) -> SpanBatch:
        if not isinstance(entry, dict):
            return SpanBatch.of(resource, rows)
        stored = cast("StoredResourceJson", entry)  # decode.resource_json's, kept in run.json
        return SpanBatch.of(otlp.plain_resource(stored), rows, resource_extra=stored)

    if (
        senders is None
        or "resource_id" not in table.column_names
        or table.column("resource_id").null_count == table.num_rows
    ):
        return [SpanBatch.of(resource, table)]
    ids = table.column("resource_id").cast(pa.string())
    unique = ids.unique().to_pylist()
    if len(unique) == 1 and isinstance(senders.get(unique[0]), dict):  # one sender: no copy
        return [sent_by(senders[unique[0]], table)]
    return [
        sent_by(senders.get(sender), table.filter(pc.fill_null(pc.equal(ids, sender), False)))
        if sender is not None
        else SpanBatch.of(resource, table.filter(pc.is_null(ids)))
        for sender in unique
    ]
