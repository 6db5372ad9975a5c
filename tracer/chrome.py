"""Spans -> Chrome trace event JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

Each level-set run is a process; host spans sit on their thread's track, GPU work on one track per
CUDA stream; a model span has its own track so that iterations read as a timeline. Times are
microseconds (the format's unit). Files ending in ``.gz`` are gzip-compressed.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracer import schema

MODEL_TRACK = 0


def chrome_events(pid: int, resource: Mapping[str, Any], table: pa.Table) -> list[dict[str, Any]]:
    """Complete ("X") events for every span of one run, plus the track names."""
    label = f"xsp {resource.get(schema.RES_LEVELS, '?')} · {resource.get(schema.RES_WORKLOAD, '')}"
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": label}},
        {
            "ph": "M",
            "pid": pid,
            "tid": MODEL_TRACK,
            "name": "thread_name",
            "args": {"name": "model"},
        },
    ]
    cols = table.to_pydict()
    attributes = [(c.name, c.attribute) for c in schema.ATTRIBUTE_COLUMNS]
    tracks: dict[int, str] = {}
    for row in range(table.num_rows):
        level = cols["level"][row]
        if level == schema.LEVEL_MODEL:
            tid = MODEL_TRACK
        elif level == schema.LEVEL_GPU:
            stream = cols["gpu_stream"][row] or 0
            tid = 1_000_000 + stream
            tracks.setdefault(tid, f"GPU stream {stream}")
        else:
            tid = cols["thread_id"][row] or 1
            tracks.setdefault(tid, f"thread {tid}")
        args = {key: cols[name][row] for name, key in attributes if cols[name][row] is not None}
        events.append(
            {
                "ph": "X",
                "pid": pid,
                "tid": tid,
                "name": cols["name"][row],
                "cat": level,
                "ts": cols["start_ns"][row] / 1e3,
                "dur": cols["dur_ns"][row] / 1e3,
                "args": args,
            }
        )
    for tid, name in sorted(tracks.items()):
        events.append(
            {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}}
        )
    return events


def write_chrome_trace(path: Path, runs: Iterable[tuple[Mapping[str, Any], pa.Table]]) -> int:
    """Write every run into one trace file; returns the number of span events."""
    events: list[dict[str, Any]] = []
    for pid, (resource, table) in enumerate(runs, start=1):
        events.extend(chrome_events(pid, resource, table))
    data = json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}, separators=(",", ":"))
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt") as handle:
            handle.write(data)
    else:
        Path(path).write_text(data)
    return sum(1 for e in events if e["ph"] == "X")
