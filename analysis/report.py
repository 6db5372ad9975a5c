"""The self-contained HTML report of a measurement (plotly): a flame (icicle) view of one
reconstructed iteration, each analysis as a chart and a table, and the suggestions."""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.store import MeasurementStore

#: Spans beyond this many in the flame view are dropped, shortest first (plotly stays fluid).
FLAME_MAX_SPANS = 6000


def flame_figure(spans: pa.Table) -> Any:
    """An icicle chart of the median-latency iteration: box width is the span's duration."""
    import plotly.graph_objects as go

    steps = spans.filter(pc.equal(spans.column("kind"), "step"))
    if not steps.num_rows:
        return None
    durations = np.asarray(steps.column("dur_ns"))
    median = steps.slice(int(np.argsort(durations)[len(durations) // 2]), 1)
    iteration = median.column("iteration")[0].as_py()
    one = spans.filter(pc.equal(spans.column("iteration"), iteration))
    if one.num_rows > FLAME_MAX_SPANS:
        keep = np.argsort(-np.asarray(one.column("dur_ns")))[:FLAME_MAX_SPANS]
        one = one.take(pa.array(np.sort(keep)))
    rows = one.select(["span_id", "parent_span_id", "name", "dur_ns", "level"]).to_pydict()
    ids = {str(s) for s in rows["span_id"]}
    parents = [str(p) if str(p) in ids else "" for p in rows["parent_span_id"]]
    labels = [f"{n[:60]}" for n in rows["name"]]
    figure = go.Figure(
        go.Icicle(
            ids=[str(s) for s in rows["span_id"]],
            parents=parents,
            labels=labels,
            values=[d / 1e6 for d in rows["dur_ns"]],
            branchvalues="remainder",
            hovertemplate="%{label}<br>%{value:.3f} ms<extra></extra>",
            tiling={"orientation": "v"},
            maxdepth=6,
        )
    )
    figure.update_layout(
        title=f"Iteration {iteration} (median latency), reconstructed: click a box to zoom",
        margin={"t": 40, "l": 5, "r": 5, "b": 5},
        height=650,
    )
    return figure


def _table_figure(table: pa.Table, rows: int = 25) -> Any:
    import plotly.graph_objects as go

    data = table.slice(0, rows).to_pydict()

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.3f}"
        return html.escape(str(value))[:120] if value is not None else ""

    figure = go.Figure(
        go.Table(
            header={"values": list(data), "align": "left"},
            cells={
                "values": [[cell(v) for v in column] for column in data.values()],
                "align": "left",
            },
        )
    )
    figure.update_layout(
        margin={"t": 5, "l": 5, "r": 5, "b": 5}, height=60 + 28 * min(rows, table.num_rows)
    )
    return figure


def _bar(table: pa.Table, x: str, y: str, title: str, rows: int = 20) -> Any:
    import plotly.graph_objects as go

    data = table.slice(0, rows).to_pydict()
    labels = [str(v)[:50] for v in data[x]]
    figure = go.Figure(go.Bar(x=labels, y=data[y]))
    figure.update_layout(
        title=title,
        xaxis_title=x,
        yaxis_title=y,
        margin={"t": 40, "l": 5, "r": 5, "b": 5},
        height=380,
    )
    return figure


def sections(
    store: MeasurementStore,
) -> list[tuple[str, pa.Table, Callable[[pa.Table], Any] | None]]:
    """(title, table, chart maker or None) for every analysis the measurement supports."""
    from analysis import kernels, layers, library, summary
    from analysis.monitor import monitor_summary
    from analysis.reconstruct import level_overhead
    from analysis.suggestions import suggest

    return [
        ("Suggestions", suggest(store), None),
        ("Level sets (XSP's leveled runs)", summary.level_sets(store), None),
        (
            "Overhead each deeper run added, per level",
            level_overhead(store),
            None,
        ),
        (
            "GPU monitor: SM active and occupancy against NVML's utilization",
            monitor_summary(store),
            None,
        ),
        (
            "Layer types (A5)",
            layers.layer_types(store),
            lambda t: _bar(t, "module_type", "latency_ms_per_iteration", "Time by layer type"),
        ),
        ("Layer info (A2)", layers.layer_info(store), None),
        (
            "Layer latency in execution order (A3)",
            layers.layer_latency(store),
            lambda t: _bar(t, "module_path", "median_ms", "Layer latency (forward)", rows=400),
        ),
        ("Library calls (cuBLAS, cuDNN, oneDNN)", library.library_calls(store), None),
        (
            "Kernels by name (A10)",
            kernels.kernels_by_name(store, limit=25),
            lambda t: _bar(t, "kernel", "total_ms_per_iteration", "Kernel time per iteration"),
        ),
        ("Kernels by layer (A11)", kernels.kernels_by_layer(store), None),
        ("GPU and non-GPU time per layer (A13)", kernels.gpu_time_per_layer(store), None),
        (
            "GPU busy and idle per iteration (HTA temporal breakdown)",
            kernels.temporal_breakdown(store),
            lambda t: _bar(t, "iteration", "busy_pct", "GPU busy % per iteration", rows=1000),
        ),
        ("Idle time: host wait against kernel wait (HTA)", kernels.idle_breakdown(store), None),
        ("Kernel launch statistics (HTA)", kernels.launch_statistics(store), None),
        (
            "Kernel duration distribution (HTA)",
            kernels.kernel_duration_distribution(store),
            lambda t: _bar(t, "bucket", "share_of_time_pct", "Share of kernel time by duration"),
        ),
    ]


def write_report(store: MeasurementStore, path: Path, title: str) -> int:
    """Write the report; return how many sections it holds."""
    from analysis.reconstruct import reconstruct

    spans, mismatches = reconstruct(store)
    parts = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{spans.num_rows:,} reconstructed spans; {mismatches.num_rows:,} had no counterpart "
        "in a shallower run and kept their own timing.</p>",
    ]
    figures: list[Any] = []
    flame = flame_figure(spans)
    if flame is not None:
        parts.append("<h2>Flame view</h2>")
        figures.append(flame)
        parts.append(f"{{figure{len(figures) - 1}}}")
    count = 0
    for heading, table, chart in sections(store):
        if not table.num_rows:
            continue
        count += 1
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        if chart is not None:
            figures.append(chart(table))
            parts.append(f"{{figure{len(figures) - 1}}}")
        figures.append(_table_figure(table))
        parts.append(f"{{figure{len(figures) - 1}}}")
    rendered = [
        figure.to_html(full_html=False, include_plotlyjs=(index == 0))
        for index, figure in enumerate(figures)
    ]
    body = "\n".join(parts)
    for index, snippet in enumerate(rendered):
        body = body.replace(f"{{figure{index}}}", snippet, 1)
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:1.5em;max-width:1400px}</style></head>"
        f"<body>{body}</body></html>"
    )
    path.write_text(page, encoding="utf-8")
    return count
