"""``xsp campaign report``: one self-contained HTML page comparing every job of a campaign, in the
style of XSP's section IV. Top to bottom:

1. the findings, worked out from the job records (``xsp.campaign.compare.findings``);
2. cross-model figures: throughput per model at the largest batch, GPU busy share per model at
   each batch size (launch-bound or compute-bound), convolution's share of layer time;
3. batch-scaling curves as small multiples, one panel per model family;
4. one row per model with the batch sizes as columns;
5. every job, sortable and filterable, with links to each run's own report.

plotly.js is embedded once, with the first figure; the sorter and filter are a few lines of
inline JavaScript, so the page works offline."""

from __future__ import annotations

import html
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from xsp.analysis.figures.present import short_kernel
from xsp.campaign import compare
from xsp.campaign.compare import Record, optimal_batches
from xsp.campaign.names import family_order
from xsp.campaign.run_reports import run_report, write_run_reports
from xsp.campaign.store import CampaignStore
from xsp.campaign.summary import COMPUTE_BOUND_BUSY_PCT

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from xsp.campaign.spec import CampaignSpec

__all__ = ["optimal_batches", "write_campaign_report", "write_run_reports"]
#: A campaign directory's hand-written findings, linked from the report when present.
FINDINGS_FILE = "FINDINGS.md"
#: Families' colours in the bar charts, in ``family_order()``; "Other ..." families take the rest.
FAMILY_COLORS = (
    "#2E91E5",
    "#E15F99",
    "#1CA71C",
    "#FB0D0D",
    "#DA16FF",
    "#222A2A",
    "#B68100",
    "#750D86",
    "#EB663B",
    "#511CFB",
    "#00A08B",
    "#FB00D1",
    "#FC0080",
    "#6C7C32",
)
BOUND_COLORS = {"launch-bound": "crimson", "mixed": "orange", "compute-bound": "seagreen"}
#: Small multiples: panels per row and each row's height in pixels.
PANEL_COLUMNS = 3
PANEL_ROW_PX = 320
BAR_PX = 420
#: The figures' sections: id -> heading, in page order.
FIGURE_SECTIONS = {"figures": "Across models", "scaling": "Batch scaling"}
Figure = tuple[str, str, "go.Figure"]  # (section id, title, figure)

CSS = """
body{font-family:sans-serif;margin:1.5em;max-width:1800px}
h2{margin-top:1.6em;border-bottom:1px solid #ddd}
.meta{color:#555}
#findings li{margin:.25em 0;line-height:1.35}
table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top;white-space:nowrap}
th{background:#f3f3f3;white-space:normal;vertical-align:bottom}
th[data-col]{cursor:pointer}
th[data-dir=asc]::after{content:" ▲"}
th[data-dir=desc]::after{content:" ▼"}
td.n{text-align:right;font-variant-numeric:tabular-nums}
td.launch-bound{background:#fbe3e6}
td.mixed{background:#fff0d6}
td.compute-bound{background:#ddf2e4}
.scroll{overflow-x:auto}
input[type=search]{width:28em;margin:.4em 0}
"""

SCRIPT = """
document.querySelectorAll('th[data-col]').forEach(th => th.addEventListener('click', () => {
  const table = th.closest('table'), body = table.tBodies[0], col = +th.dataset.col;
  const dir = th.dataset.dir === 'asc' ? -1 : 1;
  table.querySelectorAll('th[data-col]').forEach(h => delete h.dataset.dir);
  th.dataset.dir = dir > 0 ? 'asc' : 'desc';
  const key = row => {
    const cell = row.cells[col];
    if (!cell) return null;
    if (cell.dataset.v !== undefined) return cell.dataset.v === '' ? null : +cell.dataset.v;
    const text = cell.textContent.trim().toLowerCase();
    return text === '' ? null : text;
  };
  const rows = [...body.rows].map(r => [key(r), r]);
  rows.sort(([a], [b]) => a === null ? (b === null ? 0 : 1) : b === null ? -1 :
    dir * (typeof a === 'number' && typeof b === 'number' ? a - b :
           String(a).localeCompare(String(b), undefined, {numeric: true})));
  rows.forEach(([, r]) => body.appendChild(r));
}));
document.querySelectorAll('input[data-filter]').forEach(input => input.addEventListener('input',
  () => {
    const table = document.getElementById(input.dataset.filter);
    const terms = input.value.toLowerCase().split(/\\s+/).filter(Boolean);
    let shown = 0;
    for (const row of table.tBodies[0].rows) {
      const text = row.textContent.toLowerCase();
      const keep = terms.every(t => text.includes(t));
      row.hidden = !keep;
      shown += keep;
    }
    document.getElementById(input.dataset.filter + '-count').textContent = shown;
  }));
"""


# -- cells -----------------------------------------------------------------------------------
def number(value: Any, significant: int = 3, max_decimals: int = 2) -> str:
    """A number for a table cell: integers (and floats that round to one) without decimals,
    others to ``significant`` digits, at most ``max_decimals`` decimals, trailing zeros dropped:
    ``20.0`` -> ``20``, ``3.2141`` -> ``3.21``, ``4978.04`` -> ``4,978``."""
    if value is None or isinstance(value, bool):
        return "" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    size = abs(float(value))
    if size == 0 or not math.isfinite(size):
        return "0" if size == 0 else str(value)
    decimals = max(0, min(max_decimals, significant - 1 - math.floor(math.log10(size))))
    text = f"{value:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _num_cell(value: Any, significant: int = 3, max_decimals: int = 2, traced: bool = False) -> str:
    """A number's cell, sortable by its value; ``traced``: a traced run's figure, said so."""
    raw = "" if value is None else repr(float(value))
    shown = number(value, significant, max_decimals)
    if traced and value is not None:
        shown += " <span class='meta'>(traced)</span>"
    return f"<td class='n' data-v='{raw}'>{shown}</td>"


def _text_cell(text: str, css: str = "") -> str:
    return f"<td class='{css}'>{text}</td>" if css else f"<td>{text}</td>"


def _shares(pairs: list[Any], kernels: bool = False) -> str:
    """``[["Conv2d", 45.3], ...]`` -> ``Conv2d 45.3%, ...``; kernel names shortened, the whole
    name kept in the ``title`` for hover."""
    parts = []
    for pair in pairs:
        name, share = (pair[0], pair[1]) if isinstance(pair, list) else (pair, None)
        text = html.escape(short_kernel(str(name)) if kernels else str(name))
        if kernels:
            text = f"<span title='{html.escape(str(name), quote=True)}'>{text}</span>"
        parts.append(text + (f" {number(share, 3, 1)}%" if share is not None else ""))
    return ", ".join(parts)


def _head(columns: list[str]) -> str:
    return "".join(f"<th data-col='{i}'>{html.escape(name)}</th>" for i, name in enumerate(columns))


def _link(store: CampaignStore, job: str | None, text: str, out: Path) -> str:
    link = run_report(store, job) if job else None
    if link is None or not link.exists():
        return text
    href = os.path.relpath(link.resolve(), out.parent.resolve())
    return f"<a href='{html.escape(href)}'>{text}</a>"


# -- tables ----------------------------------------------------------------------------------
def per_model_table(rows: list[Record], batches: list[int], modes: int) -> str:
    """One row per workload; latency, throughput, GPU busy share and bound at each batch size."""
    groups = [
        ("Latency (ms)", "latency_ms"),
        ("Throughput (items/s)", "throughput_per_s"),
        ("GPU busy (%)", "gpu_busy_pct"),
        ("Bound", "bound"),
    ]
    singles_before = ["Model", "Family"]
    singles_after = ["Optimal batch", "Conv share (%), largest batch", "Top layer types"]
    top = "".join(
        f"<th rowspan='2' data-col='{i}'>{html.escape(h)}</th>"
        for i, h in enumerate(singles_before)
    )
    col = len(singles_before)
    bottom = ""
    for title, _ in groups:
        top += f"<th colspan='{len(batches)}'>{html.escape(title)}</th>"
        for b in batches:
            bottom += f"<th data-col='{col}'>batch {b}</th>"
            col += 1
    for h in singles_after:
        top += f"<th rowspan='2' data-col='{col}'>{html.escape(h)}</th>"
        col += 1
    body = []
    for row in rows:
        name = html.escape(row["model"] + (f" ({row['mode']})" if modes > 1 else ""))
        cells = [_text_cell(name), _text_cell(html.escape(row["family"]))]
        for _, key in groups:
            for b in batches:
                value = row.get(f"{key}_b{b}")
                if key == "bound":
                    failed = row.get(f"status_b{b}") not in (None, "ok")
                    text = (value or "").replace("-bound", "") or ("failed" if failed else "")
                    cells.append(_text_cell(text, value or ""))
                elif key == "gpu_busy_pct":
                    traced = row.get(f"gpu_timeline_b{b}") == "traced"
                    cells.append(_num_cell(value, 3, 1, traced))
                else:
                    traced = row.get(f"step_source_b{b}") == "traced"
                    cells.append(_num_cell(value, 3, 1 if key == "throughput_per_s" else 3, traced))
        cells.append(_num_cell(row.get("optimal_batch")))
        cells.append(_num_cell(row.get("conv_share_pct"), 3, 1))
        cells.append(_text_cell(_shares(row.get("top_layer_types") or [])))
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f"<div class='scroll'><table id='per-model-table'><thead><tr>{top}</tr><tr>{bottom}</tr>"
        f"</thead><tbody>{''.join(body)}</tbody></table></div>"
    )


JOB_COLUMNS = [
    "Model",
    "Mode",
    "Batch",
    "Status",
    "Latency (ms)",
    "Step from",
    "Throughput (items/s)",
    "Optimal batch",
    "GPU busy (%)",
    "Median kernel (µs)",
    "Bound",
    "SM active (%)",
    "NVML utilization (%)",
    "Job time (s)",
    "Suggestions",
    "Top layer types",
    "Top kernels",
]


def _step_from(summary: Any) -> str:
    """Where a job's step comes from: "replayed" (the untraced step, replayed), "M" (measured
    untraced, no replay) or "traced"; and its GPU figures where they come from a traced run."""
    source = summary.get("step_source") or ""
    if summary.get("gpu_timeline") == "traced" and source != "traced":
        return f"{source}; GPU traced" if source else "GPU traced"
    return str(source)


def job_table(store: CampaignStore, results: list[Record], out: Path) -> str:
    """Every job, one row each, sortable by any column and filterable by words."""
    best = optimal_batches(results)
    body = []
    for r in sorted(results, key=lambda r: (r["model"], r["mode"], r["batch_size"])):
        s = (r.get("summary") or {}) if r.get("status") == "ok" else {}
        monitor = s.get("monitor") or {}
        status = html.escape(str(r.get("status", "")))
        if r.get("status") != "ok":
            status += html.escape(f": {r.get('reason') or ''}")
        bound = s.get("bound") or ""
        cells = [
            _text_cell(_link(store, r.get("job"), html.escape(r["model"]), out)),
            _text_cell(html.escape(str(r["mode"]))),
            _num_cell(r["batch_size"]),
            _text_cell(status),
            _num_cell(s.get("latency_ms"), 3, 3),
            _text_cell(html.escape(_step_from(s))),
            _num_cell(s.get("throughput_per_s"), 3, 1),
            _text_cell("yes" if best.get((r["model"], r["mode"])) == r["batch_size"] else ""),
            _num_cell(s.get("gpu_busy_pct"), 3, 1, s.get("gpu_timeline") == "traced"),
            _num_cell(s.get("median_kernel_us"), 3, 1),
            _text_cell(html.escape(bound), bound),
            _num_cell(monitor.get("sm_active_pct"), 2, 2),
            _num_cell(monitor.get("utilization_pct"), 2, 1),
            _num_cell(r.get("wall_s"), 3, 1),
            _text_cell(html.escape(", ".join(s.get("suggestions") or []))),
            _text_cell(_shares(s.get("top_layer_types") or [])),
            _text_cell(_shares(s.get("top_kernels") or [], kernels=True)),
        ]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        "<input type='search' data-filter='jobs-table' placeholder='filter: every word must "
        "appear in the row (e.g. resnet launch-bound)'> "
        f"<span id='jobs-table-count'>{len(results)}</span> of {len(results)} jobs shown"
        f"<div class='scroll'><table id='jobs-table'><thead><tr>{_head(JOB_COLUMNS)}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


# -- figures ---------------------------------------------------------------------------------
def _family_color(family: str) -> str:
    order = family_order()
    index = order.index(family) if family in order else len(order)
    return FAMILY_COLORS[index % len(FAMILY_COLORS)]


def _label(row: Record, names: dict[tuple[str, str], str]) -> str:
    return names[(row["model"], row["mode"])]


def plot_ranked(
    rows: list[Record], key: str, names: dict[tuple[str, str], str], axis: str, log: bool = False
) -> go.Figure:
    """One bar per workload, sorted high to low, coloured by family (one legend entry each)."""
    import plotly.graph_objects as go

    have = sorted((r for r in rows if r.get(key)), key=lambda r: -r[key])
    figure = go.Figure()
    order = family_order()
    present = {r["family"] for r in have}
    for fam in [f for f in order if f in present] + sorted(present - set(order)):
        mine = [r for r in have if r["family"] == fam]
        figure.add_trace(
            go.Bar(
                x=[_label(r, names) for r in mine],
                y=[r[key] for r in mine],
                name=fam,
                marker_color=_family_color(fam),
                hovertemplate="%{x}: %{y:,.3~g}<extra>" + html.escape(fam) + "</extra>",
            )
        )
    figure.update_xaxes(
        categoryorder="array", categoryarray=[_label(r, names) for r in have], tickangle=-60
    )
    if log:
        figure.update_yaxes(type="log", dtick=1, tickformat="~s")
    figure.update_yaxes(title=axis)
    figure.update_layout(
        height=BAR_PX,
        # the legend's two rows sit in the top margin, below the mode bar
        margin_t=95,
        legend={
            "font": {"size": 11},
            "orientation": "h",
            "y": 1.02,
            "yanchor": "bottom",
            "entrywidth": 0.14,
            "entrywidthmode": "fraction",
        },
    )
    return figure


def plot_busy(
    rows: list[Record], batches: list[int], names: dict[tuple[str, str], str]
) -> go.Figure:
    """GPU busy share of the step per workload, one panel per batch size, each sorted; the bars
    coloured by launch-bound, mixed or compute-bound, the compute-bound threshold drawn."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    titles = []
    for b in batches:
        bounds = [r.get(f"bound_b{b}") for r in rows]
        counts = ", ".join(f"{bounds.count(k)} {k}" for k in BOUND_COLORS if bounds.count(k))
        titles.append(f"batch {b}: {counts}")
    figure = make_subplots(rows=len(batches), cols=1, subplot_titles=titles, vertical_spacing=0.16)
    shown: set[str] = set()
    for index, b in enumerate(batches, start=1):
        key = f"gpu_busy_pct_b{b}"
        have = sorted((r for r in rows if r.get(key) is not None), key=lambda r: -r[key])
        for bound, color in BOUND_COLORS.items():
            mine = [r for r in have if r.get(f"bound_b{b}") == bound]
            if not mine:
                continue
            figure.add_trace(
                go.Bar(
                    x=[_label(r, names) for r in mine],
                    y=[r[key] for r in mine],
                    name=bound,
                    legendgroup=bound,
                    showlegend=bound not in shown,
                    marker_color=color,
                    hovertemplate="%{x}: %{y:.1f}% busy<extra>" + bound + "</extra>",
                ),
                row=index,
                col=1,
            )
            shown.add(bound)
        figure.update_xaxes(
            categoryorder="array",
            categoryarray=[_label(r, names) for r in have],
            tickangle=-60,
            tickfont={"size": 9},
            row=index,
            col=1,
        )
        figure.update_yaxes(title="GPU busy (%)", range=[0, 100], row=index, col=1)
        figure.add_hline(
            y=COMPUTE_BOUND_BUSY_PCT, line_dash="dot", line_color="grey", row=index, col=1
        )
    figure.update_layout(
        height=330 * len(batches), margin_t=60, legend={"orientation": "h", "y": 1.06}
    )
    return figure


def plot_scaling(
    rows: list[Record], batches: list[int], names: dict[tuple[str, str], str]
) -> go.Figure:
    """Small multiples: throughput against batch size (log-log), one panel per model family,
    one line per model, each panel with its own legend at its right."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    by_family: dict[str, list[Record]] = {}
    for workload in rows:  # rows arrive in family order
        if any(workload.get(f"throughput_per_s_b{b}") for b in batches):
            by_family.setdefault(workload["family"], []).append(workload)
    families = list(by_family)
    columns = max(1, min(PANEL_COLUMNS, len(families)))
    panel_rows = max(1, math.ceil(len(families) / columns))
    figure = make_subplots(
        rows=panel_rows,
        cols=columns,
        subplot_titles=families,
        horizontal_spacing=0.14,
        vertical_spacing=0.3 / panel_rows,
    )
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
    dashes = ("solid", "dash", "dot")
    for index, fam in enumerate(families):
        panel_row, panel_col = index // columns + 1, index % columns + 1
        legend = "legend" if index == 0 else f"legend{index + 1}"
        for i, r in enumerate(by_family[fam]):
            points = [
                (b, r[f"throughput_per_s_b{b}"]) for b in batches if r.get(f"throughput_per_s_b{b}")
            ]
            figure.add_trace(
                go.Scatter(
                    x=[p[0] for p in points],
                    y=[p[1] for p in points],
                    mode="lines+markers",
                    name=_label(r, names),
                    legend=legend,
                    line={
                        "color": palette[i % len(palette)],
                        "dash": dashes[i // len(palette) % 3],
                    },
                    marker={"size": 5},
                    hovertemplate=_label(r, names) + " b%{x}: %{y:,.0f} items/s<extra></extra>",
                ),
                row=panel_row,
                col=panel_col,
            )
        suffix = "" if index == 0 else str(index + 1)
        x_domain = figure.layout[f"xaxis{suffix}"].domain
        y_domain = figure.layout[f"yaxis{suffix}"].domain
        figure.layout[legend] = {
            "x": x_domain[1] + 0.005,
            "y": y_domain[1],
            "xanchor": "left",
            "yanchor": "top",
            "bgcolor": "rgba(255,255,255,0.6)",
            "font": {"size": 9},
            "tracegroupgap": 0,
        }
    figure.update_xaxes(type="log", tickvals=batches, title_text="batch size", title_standoff=2)
    figure.update_yaxes(
        type="log", dtick=1, tickformat="~s", title_text="items/s", title_standoff=2
    )
    figure.update_layout(height=PANEL_ROW_PX * panel_rows, margin_t=40)
    return figure


# -- the page --------------------------------------------------------------------------------
def plot_models_roofline(counted: list[Record], names: dict[Any, str]) -> go.Figure:
    """XSP's cross-model roofline: one point per counted job (A15: the model's FLOPs over its
    DRAM bytes against its achieved GFLOP/s over kernel time), under the roofs of the first
    job's device (measured by its counter run where it did, else the datasheet's)."""
    from xsp.analysis.figures.roofline import roofline_figure
    from xsp.analysis.tables.peaks import resolve

    first = counted[0]["summary"]["counters"]
    peaks = resolve(str(first.get("device") or ""), first.get("peaks_measured") or {})
    points = []
    for r in counted:
        c = r["summary"]["counters"]
        points.append(
            {
                "name": f"{names[(r['model'], r['mode'])]} b{r['batch_size']}",
                "arithmetic_intensity_flop_per_byte": c.get("arithmetic_intensity_flop_per_byte"),
                "achieved_gflop_per_s": c.get("achieved_gflop_per_s"),
                "roof": c.get("roof"),
                "latency_us": (c.get("kernel_ms") or 0.0) * 1e3,
            }
        )
    return roofline_figure(points, peaks, "Models on the roofline (A15 per job)")


def _findings_section(results: list[Record], store: CampaignStore, out: Path) -> str:
    items = [
        f"<li><b>{html.escape(lead)}</b>: {html.escape(text)}</li>"
        for lead, text in compare.findings(results)
    ]
    written = store.root / FINDINGS_FILE
    if written.exists():
        href = os.path.relpath(written.resolve(), out.parent.resolve())
        items.append(
            f"<li><b>Written up</b>: <a href='{html.escape(href)}'>{FINDINGS_FILE}</a>, the "
            "campaign's findings and caveats in prose.</li>"
        )
    return f"<section id='findings'><h2>Findings</h2><ul>{''.join(items)}</ul></section>"


def write_campaign_report(store: CampaignStore, out: Path, run_reports: bool = True) -> int:
    """Write the report; return the number of jobs it covers."""
    spec = store.spec()
    records = store.results()
    if run_reports:
        write_run_reports(store, records, os.cpu_count() or 1)
    # the comparisons read a record's summary by key name (``compare.Record``)
    results = cast("list[Record]", records)
    rows = compare.per_model(results)
    batches = compare.batch_sizes(results)
    modes = len({r["mode"] for r in results})
    parts = [
        _header(spec, results),
        _findings_section(results, store, out),
        *_figure_sections(_figures(results, rows, batches)),
        "<section id='per-model'><h2>Per model</h2>"
        "<p class='meta'>One row per model, the batch sizes as columns; click a heading to sort. "
        "Latency is each job's replayed, untraced step (M's median where it has no replay), GPU "
        "busy its share on the replayed timeline; a traced run's figure says so.</p>",
        per_model_table(rows, batches, modes),
        "</section>",
        "<section id='jobs'><h2>All jobs</h2>",
        job_table(store, results, out),
        "</section>",
    ]
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(spec.name)}</title><style>{CSS}</style></head>"
        f"<body>{''.join(parts)}<script>{SCRIPT}</script></body></html>"
    )
    out.write_text(page, encoding="utf-8")
    return len(results)


def _header(spec: CampaignSpec, results: list[Record]) -> str:
    """The title, what ran, and the page's table of contents."""
    ok = compare.ok_jobs(results)
    return (
        f"<h1>Campaign {html.escape(spec.name)}</h1>"
        f"<p class='meta'>{len(ok)} of {len(results)} jobs ok; device "
        f"{html.escape(spec.device)}; level sets {html.escape(', '.join(spec.level_sets))}; "
        f"{spec.iterations} iterations after {spec.warmup} warm-up. "
        "<a href='#findings'>Findings</a> · <a href='#figures'>Across models</a> · "
        "<a href='#scaling'>Batch scaling</a> · <a href='#per-model'>Per model</a> · "
        "<a href='#jobs'>All jobs</a></p>"
    )


def _figures(results: list[Record], rows: list[Record], batches: list[int]) -> list[Figure]:
    """The cross-model figures and the batch-scaling panels, each where there is data for it
    (none when no job succeeded)."""
    ok = compare.ok_jobs(results)
    if not ok:
        return []
    names = compare.display_names(results)
    largest = batches[-1] if batches else 0
    figures: list[Figure] = [
        (
            "figures",
            f"Throughput per model at batch {largest}",
            plot_ranked(rows, f"throughput_per_s_b{largest}", names, "items/s", log=True),
        )
    ]
    if any(r.get(f"gpu_busy_pct_b{b}") is not None for r in rows for b in batches):
        figures.append(
            (
                "figures",
                "Launch-bound or compute-bound: GPU busy share of the step, per model and "
                f"batch size (dotted: {COMPUTE_BOUND_BUSY_PCT:.0f}%, compute-bound above)",
                plot_busy(rows, batches, names),
            )
        )
    if any(r.get("conv_share_pct") for r in rows):
        figures.append(
            (
                "figures",
                "Convolution's share of layer time, largest batch of each model "
                "(models without convolutions left out)",
                plot_ranked(rows, "conv_share_pct", names, "conv share (%)"),
            )
        )
    counted = [r for r in ok if (r.get("summary") or {}).get("counters")]
    if counted:
        figures.append(
            (
                "figures",
                "Roofline across models: each counted job's iteration as one point "
                "(FLOPs and DRAM bytes from its counter run, kernel time from its G run)",
                plot_models_roofline(counted, names),
            )
        )
    figures.append(
        (
            "scaling",
            "Throughput against batch size, one panel per model family",
            plot_scaling(rows, batches, names),
        )
    )
    return figures


def _figure_sections(figures: list[Figure]) -> list[str]:
    """The figures as HTML, in one section per run of figures of the same section id;
    plotly.js goes in once, with the first figure."""
    parts = []
    current = None
    for index, (section, title, figure) in enumerate(figures):
        if section != current:
            if current is not None:
                parts.append("</section>")
            parts.append(f"<section id='{section}'><h2>{FIGURE_SECTIONS[section]}</h2>")
            current = section
        figure.update_layout(margin_l=5, margin_r=5, margin_b=5, template="plotly_white")
        parts.append(f"<h3>{html.escape(title)}</h3>")
        parts.append(figure.to_html(full_html=False, include_plotlyjs=(index == 0)))
    if current is not None:
        parts.append("</section>")
    return parts
