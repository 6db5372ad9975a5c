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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the registry is read when the CLI starts: keep it free of pyarrow
    from xsp.tracer.export.sinks import SpanBatch
    from xsp.tracer.store import Run


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
            from xsp.tracer.export.sinks import SpanBatch

            return [RunSpans(SpanBatch.of(r.resource, r.spans()), rank_pids(r.meta)) for r in runs]

        return cls(runs, spans)


@dataclass(frozen=True)
class ExportFormat:
    """One export format: its name (``--format NAME``), one line of help, its write function."""

    name: str
    help: str
    write: Callable[[ExportSource, Path | None], str | None]


def rank_pids(meta: Mapping[str, Any]) -> dict[int, int]:
    """Rank -> OS pid of a multi-rank run (its run.json's ``ranks``)."""
    return {
        int(rank["rank"]): int(rank["pid"])
        for rank in meta.get("ranks") or []
        if isinstance(rank, dict) and isinstance(rank.get("pid"), int)
    }
