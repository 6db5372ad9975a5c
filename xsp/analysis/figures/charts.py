"""Plotly charts of analysis tables (the report calls them; tests render them headless)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from xsp.analysis.figures.present import (
    KERNEL_COLUMNS,
    byte_scale,
    distinct_kernels,
    header,
    short_label,
)

__all__ = ["bar", "memory_over_step", "stacked_bars"]


def bar(table: pa.Table, x: str, y: str, title: str, rows: int = 20) -> Any:
    """Bars of ``y`` by ``x`` for the first ``rows`` rows. Every row keeps its own bar: kernels
    that differ only in template arguments keep the arguments that tell them apart, other
    labels that shorten alike get a rank prefix, and the full name shows on hover. Sizes are
    drawn in the binary unit of the largest (an axis of bytes read "1B" for a billion)."""
    import plotly.graph_objects as go

    data = table.slice(0, rows).to_pydict()
    full = [str(v) for v in data[x]]
    labels = distinct_kernels(full) if x in KERNEL_COLUMNS else [short_label(v) for v in full]
    if len(set(labels)) < len(labels):
        labels = [f"{rank}. {label}" for rank, label in enumerate(labels, start=1)]
    values, y_title = data[y], header(y)
    if y.endswith("bytes") or "_bytes_per_" in y:
        unit, size = byte_scale(max((abs(v) for v in values if v is not None), default=0))
        values = [None if v is None else v / size for v in values]
        y_title = (
            y_title.replace("(per ", f"({unit}/") if "(per " in y_title else f"{y_title} ({unit})"
        )
    figure = go.Figure(
        go.Bar(x=labels, y=values, hovertext=full, hoverinfo="text+y", marker_color="#4c6ef5")
    )
    figure.update_layout(
        title=title,
        xaxis_title=header(x),
        yaxis_title=y_title,
        xaxis={"type": "category"},
        margin={"t": 40, "l": 5, "r": 5, "b": 5},
        height=420,
    )
    return figure


def stacked_bars(table: pa.Table, x: str, ys: list[str], title: str) -> Any:
    """One bar per row of ``table`` by ``x``, stacked from the ``ys`` columns (the parts of one
    whole, such as a rank's step split into computation and communication)."""
    import plotly.graph_objects as go

    data = table.to_pydict()
    labels = [str(v) for v in data[x]]
    figure = go.Figure([go.Bar(name=header(y), x=labels, y=data[y]) for y in ys])
    figure.update_layout(
        title=title,
        barmode="stack",
        xaxis_title=header(x),
        xaxis={"type": "category"},
        margin={"t": 40, "l": 5, "r": 5, "b": 5},
        height=420,
    )
    return figure


def memory_over_step(timeline: Any) -> Any:
    """The allocated bytes over one step (a ``memory_timeline.MemoryTimeline``) as stacked
    bands by the layer whose allocations hold them, from the bytes held from before the step up
    to the allocator's total, with the peak marked."""
    import plotly.graph_objects as go

    from xsp.analysis.figures.present import human_bytes
    from xsp.analysis.tables.memory_timeline import BEFORE, CHART_POINTS, OTHERS, bands, sample

    rows = sample(timeline.total_bytes, CHART_POINTS)
    # float32: the page carries the series in base64, and seven digits are more than a chart shows
    x = timeline.time_ms[rows].astype("float32")
    figure = go.Figure()
    greys = {BEFORE: "#868e96", OTHERS: "#ced4da"}  # the bands that are no one layer
    for name, held in bands(timeline).items():
        figure.add_trace(
            go.Scatter(
                x=x,
                y=(held[rows] / 2**30).astype("float32"),
                name=short_label(name),
                stackgroup="held",
                line={
                    "width": 0.5,
                    "shape": "hv",
                    **({"color": greys[name]} if name in greys else {}),
                },
                hovertemplate=f"{name}<br>%{{y:.3f}} GiB at %{{x:.3f}} ms<extra></extra>",
            )
        )
    peak_gib = timeline.peak_bytes / 2**30
    figure.add_trace(
        go.Scatter(
            x=[timeline.peak_ms],
            y=[peak_gib],
            mode="markers+text",
            marker={"color": "#e03131", "size": 10, "symbol": "x"},
            text=[f"peak {human_bytes(timeline.peak_bytes)}"],
            textposition="top center",
            name="peak",
            hovertemplate=(
                f"peak {human_bytes(timeline.peak_bytes)} at {timeline.peak_ms:.3f} ms, in "
                f"{timeline.layer[timeline.peak]}<extra></extra>"
            ),
        )
    )
    figure.update_layout(
        title=(
            f"Allocated over the step ({timeline.device}, iteration {timeline.iteration}, "
            f"{timeline.levels} run), by the layer holding it"
        ),
        xaxis_title="Time from the step's start (ms)",
        yaxis_title="Allocated (GiB)",
        margin={"t": 40, "l": 5, "r": 5, "b": 5},
        height=480,
    )
    return figure
