"""The self-contained HTML report of a measurement: first the answer (the verdict, its causes,
the top suggestions and layers, the replay's warnings: ``xsp.analysis.answer``), then
the flame view and the timeline of the replayed step (``xsp.analysis.figures.step_html``), then
every analysis (``xsp.analysis.catalog``) as a chart and a table.

Tables are plain HTML with every row (in a scrolling box), headers as words with units and a
note wherever an analysis ranks and keeps only its top rows; charts are plotly, whose script is
embedded once, gzip-compressed, and unpacked when the first chart comes near the window: the
page works offline and opens without parsing plotly's 4.8 MB.
"""

from __future__ import annotations

import base64
import gzip
import html
from pathlib import Path
from typing import Any

import pyarrow as pa

from xsp.analysis.answer import ANSWER_STYLE, answer, answer_html
from xsp.analysis.catalog import sections
from xsp.analysis.figures.present import KERNEL_COLUMNS, cell, distinct_kernels, header
from xsp.analysis.figures.step_html import STEP_STYLE, step_html
from xsp.analysis.figures.views import StepView, step_view
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.replay.critical_path import has_gpu

__all__ = ["GPU_ONLY_NOTES", "STYLE", "html_table", "write_report"]

#: Sections whose absence a CPU run does not mention: they need a GPU run (Nsight Compute).
GPU_ONLY_NOTES = frozenset({"hardware_counters"})

STYLE = """
body{font-family:sans-serif;margin:1em 1.5em;max-width:1500px}
h1{font-size:1.3em;margin:.2em 0}
.table{max-height:420px;overflow:auto;border:1px solid #dee2e6;margin-bottom:.3em}
table{border-collapse:collapse;font-size:13px;width:100%}
th{position:sticky;top:0;background:#f1f3f5;text-align:left;padding:4px 8px}
td{padding:3px 8px;border-top:1px solid #f1f3f5}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.table th{padding:4px 6px;vertical-align:bottom;hyphens:auto;overflow-wrap:break-word}
.table td{padding:3px 6px;overflow-wrap:anywhere}
.table td.num{overflow-wrap:normal;white-space:nowrap}
section.analysis{content-visibility:auto;contain-intrinsic-size:auto 700px}
table.one-row{width:auto}
table.one-row th{position:static;text-align:left}
p.note{color:#495057;font-size:13px;margin:.2em 0 1em}
"""


#: The type of a chart's drawing script until it comes near the window (``LAZY_SCRIPT``).
LAZY_TYPE = "text/x-xsp-when-seen"
#: The type of the script that holds plotly.js, gzip-compressed and in base64.
PLOTLY_TYPE = "text/x-xsp-plotly-gzip"
#: Runs each chart's drawing script once its box comes within 200 px of the window, plotly's
#: own script unpacked (DecompressionStream) and run before the first: the analyses' charts then
#: cost the page's load nothing. Without IntersectionObserver every chart draws at once.
LAZY_SCRIPT = f"""
(function () {{
  let plotly = null;
  const load = () => plotly || (plotly = (async () => {{
    const packed = document.querySelector('script[type="{PLOTLY_TYPE}"]');
    const bytes = Uint8Array.from(atob(packed.text), (c) => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    const script = document.createElement("script");
    script.text = await new Response(stream).text();
    document.head.appendChild(script);
  }})());
  const run = (old) => load().then(() => {{
    const script = document.createElement("script");
    script.text = old.text;
    old.replaceWith(script);
  }});
  const waiting = Array.from(document.querySelectorAll('script[type="{LAZY_TYPE}"]'));
  if (!("IntersectionObserver" in window)) {{ waiting.forEach(run); return; }}
  const seen = new IntersectionObserver((entries) => entries.forEach((entry) => {{
    if (!entry.isIntersecting) return;
    seen.unobserve(entry.target);
    run(entry.target.querySelector('script[type="{LAZY_TYPE}"]'));
  }}), {{ rootMargin: "200px 0px" }});
  waiting.forEach((script) => seen.observe(script.parentElement));
}})();
"""


def plotly_packed() -> str:
    """plotly.js as the page holds it: gzip-compressed, in base64 (1.9 MB for 4.8)."""
    from plotly.offline import get_plotlyjs

    packed = gzip.compress(get_plotlyjs().encode("utf-8"), compresslevel=9, mtime=0)
    return base64.b64encode(packed).decode("ascii")


def _drawn_when_seen(snippet: str) -> str:
    """A chart's HTML whose drawing script (the first after its graph's box) waits for
    ``LAZY_SCRIPT``."""
    start = snippet.find("<script>", snippet.find("plotly-graph-div"))
    if start < 0:
        return snippet
    return snippet[:start] + f'<script type="{LAZY_TYPE}">' + snippet[start + len("<script>") :]


#: A one-row table with more columns than this reads down, a row per column (it fits 800 px).
WIDE_ONE_ROW = 6


def html_table(table: pa.Table) -> str:
    """Every row of ``table``; numbers right-aligned; kernel names shortened (different kernels
    apart, ``distinct_kernels``), full on hover. One row of many columns reads down."""
    columns = table.column_names
    if table.num_rows == 1 and len(columns) > WIDE_ONE_ROW:
        (record,) = table.to_pylist()
        rows = "".join(
            f"<tr><th title='{html.escape(c)}'>{html.escape(header(c))}</th>{_td(c, record[c])}"
            "</tr>"
            for c in columns
        )
        return f"<div class='table'><table class='one-row'><tbody>{rows}</tbody></table></div>"
    head = "".join(f"<th title='{html.escape(c)}'>{html.escape(header(c))}</th>" for c in columns)
    shown = {
        c: distinct_kernels([str(v or "") for v in table.column(c).to_pylist()])
        for c in columns
        if c in KERNEL_COLUMNS
    }
    body = []
    for row, record in enumerate(table.to_pylist()):
        cells = []
        for column in columns:
            value = record[column]
            if isinstance(value, str) and column in KERNEL_COLUMNS:
                short = shown[column][row]
                text = f"<span title='{html.escape(value)}'>{html.escape(short)}</span>"
                cells.append(f"<td>{text}</td>")
            else:
                cells.append(_td(column, value))
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (
        f"<div class='table'><table><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _td(column: str, value: object) -> str:
    text = html.escape(cell(column, value))
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return f"<td class='num'>{text}</td>" if numeric else f"<td>{text}</td>"


def _step_view(store: MeasurementStore, spans: pa.Table) -> StepView | None:
    """The replayed step's boxes, its layers' critical-path time with them."""
    from xsp.analysis.replay.critical_path import critical_by_layer

    view = step_view(spans)
    if view is None:
        return None
    return step_view(spans, critical_by_layer(store, view.iteration, view.rank))


def _flame_mode(store: MeasurementStore) -> str:
    """The flame's width at first: GPU time where GPU compute leads the step's critical path,
    else step time (in a host-bound step the GPU's time says little)."""
    from xsp.analysis.replay import CAUSE_GPU
    from xsp.analysis.replay.critical_path import step_causes

    if not has_gpu(store):
        return "host"
    causes = step_causes(store).to_pylist()
    lead = max(causes, key=lambda r: r["ms_per_iteration"], default=None)
    return "gpu" if lead is not None and lead["cause"] == CAUSE_GPU else "host"


def write_report(store: MeasurementStore, path: Path, title: str) -> int:
    """Write the report; return how many analysis sections it holds."""
    from xsp.analysis.reconstruction.reconstruct import reconstruct

    spans, mismatches = reconstruct(store)
    found = sections(store)
    parts = [
        f"<h1>{html.escape(title)}</h1>",
        answer_html(answer(store, {s.key: s for s in found})),
        f"<p class='note'>{spans.num_rows:,} reconstructed spans; {mismatches.num_rows:,} had "
        "no counterpart in a shallower run and kept their own timing.</p>",
    ]
    figures: list[Any] = []

    def place(figure: Any) -> None:
        figures.append(figure)
        parts.append(f"{{figure{len(figures) - 1}}}")

    view = _step_view(store, spans)
    if view is not None:
        flame, timeline = step_html(view, _flame_mode(store))
        parts += ["<h2 id='flame'>Flame view</h2>", flame, "<h2 id='timeline'>Timeline</h2>"]
        parts.append(timeline)
    count = 0
    gpu = has_gpu(store)
    for section in found:
        if section.absent and not gpu and section.key in GPU_ONLY_NOTES:
            continue  # a CPU run: no note about what only a GPU run could have had
        if section.absent:
            parts.append(f"<h2 id='{section.key}'>{html.escape(section.title)}</h2>")
            parts.append(f"<p class='note'>{html.escape(section.note)}</p>")
            continue
        if not section.table.num_rows:
            continue
        count += 1
        # a section of its own: laid out only when near the window (``content-visibility``)
        title = html.escape(section.title)
        parts.append(f"<section class='analysis'><h2 id='{section.key}'>{title}</h2>")
        if section.chart is not None:
            place(section.chart(section.table))
        parts.append(html_table(section.table))
        rows = f"{section.table.num_rows:,} rows"
        note = f"{rows}: {section.note}" if section.note else rows
        parts.append(f"<p class='note'>{html.escape(note)}</p></section>")
    rendered = [
        _drawn_when_seen(figure.to_html(full_html=False, include_plotlyjs=False))
        for figure in figures
    ]
    body = "\n".join(parts)
    for index, snippet in enumerate(rendered):
        body = body.replace(f"{{figure{index}}}", snippet, 1)
    page = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}{ANSWER_STYLE}{STEP_STYLE}</style>"
        f"</head><body>{body}"
        + (f"<script type='{PLOTLY_TYPE}'>{plotly_packed()}</script>" if figures else "")
        + f"<script>{LAZY_SCRIPT}</script></body></html>"
    )
    path.write_text(page, encoding="utf-8")
    return count
