"""Roofline plots (plotly), in the style of XSP's figures: achieved GFLOP/s against arithmetic
intensity on log axes, under the DRAM-bandwidth slope and a flat roof per precision. The report
draws A9 (kernels) and A14 (layers) from ``xsp.analysis.tables.counters``' tables, the campaign report
one point per model; tests render them headless."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from xsp.analysis.figures.present import short_kernel, short_label
from xsp.analysis.tables.peaks import ROOFS, Peaks

__all__ = ["COLOURS", "plot_roofline", "roofline_figure"]

#: One colour per roof, points and their ceiling alike.
COLOURS = {
    "fp64": "#862e9c",
    "fp64_tensor": "#ae3ec9",
    "fp32": "#1971c2",
    "tf32_tensor": "#0c8599",
    "fp16": "#e67700",
    "fp16_tensor": "#f08c00",
    "bf16_tensor": "#c92a2a",
    "fp8_tensor": "#5c940d",
}
_OTHER = "#868e96"


def roofline_figure(
    points: Sequence[Mapping[str, Any]],
    peaks: Peaks,
    title: str,
    label: str = "name",
    size: str | None = "latency_us",
) -> Any:
    """Points (``arithmetic_intensity_flop_per_byte``, ``achieved_gflop_per_s``, ``roof``, and
    ``label`` for hover) under the roofs of ``peaks``: DRAM bandwidth times intensity up to each
    precision's ceiling. Marker area follows ``size`` (latency) when given."""
    import plotly.graph_objects as go

    usable = [
        p
        for p in points
        if (p.get("arithmetic_intensity_flop_per_byte") or 0) > 0
        and (p.get("achieved_gflop_per_s") or 0) > 0
    ]
    figure = go.Figure()
    _add_roofs(figure, usable, peaks)
    _add_points(figure, usable, label, size)
    dram = peaks.dram
    slope = f"; DRAM slope {dram / 1e12:,.2f} TB/s" if dram else ""
    figure.update_layout(
        title={"text": f"{title}<br><sup>{peaks.summary}{slope}</sup>"},
        xaxis={"type": "log", "title": "Arithmetic intensity (FLOP/byte, DRAM)"},
        yaxis={"type": "log", "title": "Achieved (GFLOP/s)"},
        margin={"t": 70, "l": 5, "r": 5, "b": 5},
        height=520,
        legend={"font": {"size": 11}},
    )
    return figure


def _add_roofs(figure: Any, usable: Sequence[Mapping[str, Any]], peaks: Peaks) -> None:
    """The roofs of the precisions the points use, each DRAM slope up to its ceiling, over the
    points' intensities and ridges with room either side; the DRAM slope alone when none is."""
    import plotly.graph_objects as go

    intensities = [float(p["arithmetic_intensity_flop_per_byte"]) for p in usable] or [1.0]
    roofs = sorted({str(p.get("roof")) for p in usable if p.get("roof") in peaks.values})
    ridges = [r for r in (peaks.ridge(roof) for roof in roofs) if r]
    low = min([*intensities, *ridges]) / 4
    high = max([*intensities, *ridges]) * 4
    dram = peaks.dram
    for roof in roofs:
        ceiling = peaks.values[roof] / 1e9
        if dram:
            ridge = ceiling * 1e9 / dram
            xs = [low, ridge, high] if low < ridge < high else [low, high]
            ys = [min(ceiling, x * dram / 1e9) for x in xs]
        else:
            xs, ys = [low, high], [ceiling, ceiling]
        figure.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                line={"color": COLOURS.get(roof, _OTHER), "dash": "dash", "width": 1.5},
                name=f"roof: {ROOFS.get(roof, roof)} ({ceiling / 1e3:,.1f} TFLOP/s)",
                hoverinfo="name",
            )
        )
    if dram and not roofs:
        figure.add_trace(
            go.Scatter(
                x=[low, high],
                y=[low * dram / 1e9, high * dram / 1e9],
                mode="lines",
                line={"color": _OTHER, "dash": "dash"},
                name=f"DRAM {dram / 1e12:,.2f} TB/s",
            )
        )


def _add_points(
    figure: Any, usable: Sequence[Mapping[str, Any]], label: str, size: str | None
) -> None:
    """The points, one trace per roof, marker area following ``size`` where given."""
    import plotly.graph_objects as go

    groups: dict[str, list[Mapping[str, Any]]] = {}
    for p in usable:
        groups.setdefault(str(p.get("roof")), []).append(p)
    largest = max((float(p.get(size) or 0) for p in usable), default=0.0) if size else 0.0
    for roof, members in groups.items():
        names = [str(p.get(label) or "") for p in members]
        shown = [short_kernel(n) if "(" in n or "<" in n else short_label(n) for n in names]
        marker: dict[str, Any] = {"color": COLOURS.get(roof, _OTHER), "opacity": 0.75}
        if size and largest > 0:
            marker["size"] = [
                6 + 24 * math.sqrt(float(p.get(size) or 0) / largest) for p in members
            ]
        figure.add_trace(
            go.Scatter(
                x=[p["arithmetic_intensity_flop_per_byte"] for p in members],
                y=[p["achieved_gflop_per_s"] for p in members],
                mode="markers",
                marker=marker,
                name=ROOFS.get(roof, roof),
                text=shown,
                hovertemplate="%{text}<br>%{x:.3g} FLOP/byte<br>%{y:,.1f} GFLOP/s<extra></extra>",
            )
        )


def plot_roofline(table: pa.Table, peaks: Peaks, title: str) -> Any:
    """``roofline_figure`` of a roofline table (``kernel_roofline``, ``layer_roofline``)."""
    return roofline_figure(table.to_pylist(), peaks, title)
