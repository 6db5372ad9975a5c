"""Raw level records -> one span table (pure functions, no torch, no I/O).

``build_table`` asks the level registry, ``CONVERSIONS`` (read from the table of levels,
``xsp.core.levels``): each level that makes spans has one module here that turns its records
into blocks of rows (``model``, ``framework``, ``library``, ``gpu``), and the table they are added to (``table``) gives the rows span ids in stack order, so a
deeper level can hang under an earlier one's rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from xsp.core.arena import ArenaContents
from xsp.core.levels import LEVELS, ROOT, LevelInfo, resolve
from xsp.core.records import MonitorSamples
from xsp.tracer.convert.table import ConversionReport, SpanTable

__all__ = ["CONVERSIONS", "ROOT_LEVEL", "LevelConversion", "build_table"]


def build_table(
    run_id: str,
    levels: str,
    records: Mapping[str, Any],
    failures: dict[int, str] | None = None,
    monitor: MonitorSamples | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    first_span_id: int = 1,
) -> tuple[pa.Table, ConversionReport]:
    """Turn one run's raw records into a span table that follows ``schema.SPAN_SCHEMA``.

    ``records`` maps a level's letter to what it recorded (``Level.drain()``, or its part of a
    capture arena); each level's ``CONVERSIONS`` entry turns its records into blocks of rows.
    Level M's are required: every other level hangs under its iteration spans. Span ids are
    assigned block by block, in stack order (model, framework, library calls, API calls, GPU),
    so a deeper block can name its parents in an earlier one. A letter without a conversion
    (level H, whose counters Nsight Compute stores) or without records is skipped.

    ``failures`` maps an iteration to the error that ended it; its model span gets that status.
    ``monitor``: NVML samples summarized onto each model span.

    A rank of a multi-rank job (``rank``, ``world_size``) numbers its spans above
    ``schema.rank_span_id_base(rank)``, marks every span with its rank, names its steps
    ``rank N`` and hangs them under ``schema.iteration_root_id(iteration)``, the root that
    joining the ranks adds (``xsp.tracer.convert.ranks``).

    ``first_span_id``: where this table's span numbers start (a continuous session's batches
    go on from the last batch's ``report.next_span_id``, so that span ids stay unique in a run).
    """
    if records.get(ROOT_LEVEL) is None:
        raise ValueError(f"no records of level {ROOT_LEVEL}: every span hangs under its steps")
    table = SpanTable(run_id, levels, failures or {}, monitor, rank, world_size, first_span_id)
    for letter, conversion in CONVERSIONS.items():
        if records.get(letter) is not None:
            conversion.convert(table, records[letter])
    return table.finish()


@dataclass(frozen=True)
class LevelConversion:
    """What conversion knows of one level: how its records become spans (``convert`` adds its
    blocks to the table being built) and how to read them back from a capture arena
    (``from_arena``; None for a level whose records live elsewhere, such as CUPTI's buffers,
    and die with the process)."""

    convert: Callable[[SpanTable, Any], None]
    from_arena: Callable[[ArenaContents], Any] | None = None


def _conversion(info: LevelInfo, convert: str) -> LevelConversion:
    reader = resolve(info.arena_reader) if info.arena_reader else None
    return LevelConversion(resolve(convert), from_arena=reader)


#: The level every span hangs under: its records are required.
ROOT_LEVEL = ROOT.letter

#: Level letter -> its conversion, in stack order (the order span ids are given in), from the
#: table of levels (``xsp.core.levels.LEVELS``), which holds the same letters' recording side.
CONVERSIONS: dict[str, LevelConversion] = {
    info.letter: _conversion(info, info.conversion) for info in LEVELS if info.conversion
}
