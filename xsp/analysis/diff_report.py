"""The HTML report of ``xsp diff``: the step's waterfall first (what grew, what shrank), the
critical path's causes, then every section's rows.

The waterfall walks from the untraced step before to the untraced step after: each of the
layers that changed most on the replayed step's critical path, the rest of the layers together,
what lies outside any layer (and the medians' non-additivity), and the difference between the
replayed and the measured change; its bars add up to the measured change exactly.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from xsp.analysis.diff import Diff
from xsp.analysis.report import STYLE, html_table

__all__ = [
    "WATERFALL_LAYERS",
    "cause_bars",
    "waterfall_figure",
    "waterfall_steps",
    "write_diff_report",
]

#: Layers the waterfall names one by one; the rest are one bar.
WATERFALL_LAYERS = 12


def _row(result: Diff, key: str) -> dict[str, Any] | None:
    rows = result.section(key).table.to_pylist()
    return rows[0] if rows else None


def waterfall_steps(result: Diff, layers: int = WATERFALL_LAYERS) -> list[tuple[str, float]]:
    """(label, ms) bars of the step's waterfall: the step before, its changes, the step after
    (see the module notes). Without a replay (no level G on a side), the step's change alone."""
    step = _row(result, "step")
    if step is None:
        return []
    before, after = step["before_ms"], step["after_ms"]
    bars = [("step before", before)]
    replayed = _row(result, "replayed_step")
    paths = result.section("layers_critical_path").table.to_pylist()
    if replayed is None or not paths:
        return [*bars, ("change", after - before), ("step after", after)]
    named = paths[:layers]
    bars += [(r["layer"], r["change_ms"]) for r in named]
    rest = sum(r["change_ms"] for r in paths[layers:])
    bars.append((f"{len(paths) - len(named)} other layers", rest))
    in_layers = sum(r["change_ms"] for r in paths)
    bars.append(("outside layers", replayed["change_ms"] - in_layers))
    bars.append(("measured less replayed", (after - before) - replayed["change_ms"]))
    return [*bars, ("step after", after)]


def waterfall_figure(bars: list[tuple[str, float]], title: str) -> Any:
    """A plotly waterfall of ``bars``: the first and last are totals, the rest relative."""
    import plotly.graph_objects as go

    labels = [label for label, _ in bars]
    values = [value for _, value in bars]
    measure = ["absolute", *["relative"] * (len(bars) - 2), "total"]
    figure = go.Figure(
        go.Waterfall(
            x=labels,
            y=values,
            measure=measure,
            text=[
                f"{v:+.3f}" if m == "relative" else f"{v:.3f}"
                for v, m in zip(values, measure, strict=True)
            ],
            textposition="outside",
            decreasing={"marker": {"color": "#2f9e44"}},  # shrank: faster
            increasing={"marker": {"color": "#e03131"}},  # grew: slower
            totals={"marker": {"color": "#4c6ef5"}},
        )
    )
    figure.update_layout(
        title=title,
        yaxis_title="ms per iteration",
        xaxis={"type": "category"},
        margin={"t": 40, "l": 5, "r": 5, "b": 5},
        height=480,
        showlegend=False,
    )
    return figure


def cause_bars(result: Diff) -> list[tuple[str, float]]:
    """(label, ms) bars of the replayed step's waterfall by critical-path cause."""
    replayed = _row(result, "replayed_step")
    causes = result.section("causes").table.to_pylist()
    if replayed is None or not causes:
        return []
    bars = [("replayed before", replayed["before_ms"])]
    bars += [(r["cause"], r["change_ms"]) for r in causes]
    bars.append(("medians", replayed["change_ms"] - sum(r["change_ms"] for r in causes)))
    return [*bars, ("replayed after", replayed["after_ms"])]


def write_diff_report(result: Diff, path: Path) -> None:
    """Write the self-contained HTML report of ``result`` (plotly embedded once)."""
    title = f"xsp diff: {result.before} -> {result.after}"
    parts = [f"<h1>{html.escape(title)}</h1>"]
    facts = [*result.changes, *(f"warning: {w}" for w in result.warnings)]
    parts += [f"<p>{html.escape(line)}</p>" for line in facts]
    parts.append(f"<p class='note'>Verdicts: {html.escape(result.test)}.</p>")
    figures = []
    steps = waterfall_steps(result)
    if steps:
        figures.append(waterfall_figure(steps, "The untraced step: what grew, what shrank"))
    causes = cause_bars(result)
    if causes:
        figures.append(waterfall_figure(causes, "The replayed step by critical-path cause"))
    for index, figure in enumerate(figures):
        parts.append(figure.to_html(full_html=False, include_plotlyjs=index == 0))
    for section in result.sections:
        parts.append(f"<h2 id='{section.key}'>{html.escape(section.title)}</h2>")
        if section.absent:
            parts.append(f"<p class='note'>{html.escape(section.absent)}</p>")
            continue
        parts.append(html_table(section.table))
        note = f"{section.table.num_rows:,} rows" + (f": {section.note}" if section.note else "")
        parts.append(f"<p class='note'>{html.escape(note)}</p>")
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
        f"<body>{''.join(parts)}</body></html>"
    )
    path.write_text(page, encoding="utf-8")
