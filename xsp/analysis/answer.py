"""The HTML report's first screen: where the step goes and what to do, within 1280×800 and
without scrolling. The verdict with its causes' shares and the replay's checks, the top causes,
the top suggestions with their estimated gain (and the measured one where ``xsp verify`` ran),
the layers with the most time on the critical path (host time without a GPU run), and the
warnings the terminal prints about the replay. Built from the analyses the report already holds
(``xsp.analysis.catalog``), so nothing is computed twice."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xsp.analysis.catalog import Section
from xsp.analysis.measurement.store import MeasurementStore
from xsp.core.errors import XspError

__all__ = ["ANSWER_STYLE", "Answer", "answer", "answer_html", "measured_gains"]

#: How many suggestions, causes and layers the first screen shows.
TOP_SUGGESTIONS = 3
TOP_CAUSES = 4
TOP_LAYERS = 5
#: Where ``xsp verify`` writes its rows (``xsp.campaign.verify``), read here as plain JSON.
VERIFY_FILE = ("verify", "verify.json")

ANSWER_STYLE = """
#answer{display:grid;grid-template-columns:1fr 1fr;gap:.4em 1.5em;font-size:14px;
 border:1px solid #ced4da;border-radius:4px;padding:.5em 1em;margin:.3em 0 1em}
#answer h3{font-size:15px;margin:.3em 0 .2em}
#answer p{margin:.15em 0}
#answer table{font-size:13px}
#answer td{padding:2px 6px}
#verdict{grid-column:1/3;font-size:16px;font-weight:bold;margin:.2em 0}
#answer .checks{color:#495057;font-size:13px}
#warnings{grid-column:1/3;list-style:none;background:#fff3cd;border:1px solid #ffe69c;padding:.3em .6em;
 font-size:13px;margin:0}
#warnings li{margin:.1em 0}
#answer .bar{display:inline-block;height:9px;background:#4c6ef5;vertical-align:middle}
"""


#: One row a list of the first screen shows: a cause, a suggestion or a layer.
Row = dict[str, Any]


@dataclass(frozen=True)
class Answer:
    """What the first screen says; every list already cut to what it shows."""

    verdict: str
    checks: list[str] = field(default_factory=list)
    causes: list[Row] = field(default_factory=list)  # cause, ms_per_iteration, share
    suggestions: list[Row] = field(default_factory=list)  # suggest's rows + measured
    layers: list[Row] = field(default_factory=list)  # layer, ms, share_pct
    layers_title: str = ""
    warnings: list[str] = field(default_factory=list)


def answer(store: MeasurementStore, found: dict[str, Section]) -> Answer:
    """The first screen of ``store``'s report from its analyses ``found`` (by key)."""
    from xsp.analysis.replay import replay
    from xsp.analysis.replay.lines import check_lines, replay_warnings

    warnings: list[str] = []
    checks: list[str] = []
    step = ""
    step_ms = None
    try:
        result = replay(store).result()
        checks = check_lines(result)
        warnings = replay_warnings(result)
        step = _step_line(result)
        step_ms = result.step_ms
    except XspError as exc:
        warnings.append(f"no replay: {exc}")
    verdict, causes = _verdict(store, found)
    measured = measured_gains(store.root)
    suggestions = []
    section = found.get("suggestions")
    for row in (section.table.to_pylist() if section else [])[:TOP_SUGGESTIONS]:
        suggestions.append({**row, "measured": measured.get(row["rule"])})
    layers, title = _layers(store, found, step_ms)
    return Answer(
        verdict=verdict,
        checks=[step, *checks] if step else checks,
        causes=causes,
        suggestions=suggestions,
        layers=layers,
        layers_title=title,
        warnings=warnings,
    )


def _step_line(result: Any) -> str:
    """The replayed step against M's, as the terminal says it."""
    if result.step_ms is None:
        return ""
    against = (
        f" against {result.measured_run}'s measured {result.measured_step_ms:.3f} ms "
        f"({result.error_pct:+.1f}%)"
        if result.measured_step_ms
        else ""
    )
    return f"replayed step {result.step_ms:.3f} ms{against}"


def _verdict(store: MeasurementStore, found: dict[str, Section]) -> tuple[str, list[Row]]:
    """The verdict line and the causes above half a percent, largest first: the replay's
    critical path where the report has it, else the step's causes computed here (a run without
    level G is the host's work alone)."""
    from xsp.analysis.replay import critical_path

    section = found.get("step_causes")
    try:
        table = section.table if section else critical_path.step_causes(store)
        verdict = section.note if section else critical_path.verdict(store)
    except XspError as exc:
        return f"no replayed step: {exc}", []
    causes = sorted(
        (r for r in table.to_pylist() if r["share_pct"] >= 0.5), key=lambda r: -r["share_pct"]
    )
    return verdict, causes[:TOP_CAUSES]


def _layers(
    store: MeasurementStore, found: dict[str, Section], step_ms: float | None
) -> tuple[list[Row], str]:
    """The layers with the most time on the replayed step's critical path (with level G), else
    the leaf layers with the most forward host time."""
    from xsp.analysis.tables.summary import top_layers

    section = found.get("gpu_time_per_layer")
    if section is not None and "critical_path_ms" in section.table.column_names:
        rows = [
            {
                "layer": r["layer"],
                "ms": r["critical_path_ms"],
                "share_pct": 100.0 * r["critical_path_ms"] / step_ms if step_ms else None,
                "detail": f"GPU {r['gpu_ms']:.3f} ms, host {r['non_gpu_ms']:.3f} ms",
            }
            for r in section.table.to_pylist()[:TOP_LAYERS]
        ]
        return rows, "Layers by their time on the critical path"
    try:
        table = top_layers(store, limit=TOP_LAYERS)
    except XspError:
        return [], ""
    rows = [
        {
            "layer": r["module_path"],
            "ms": r["mean_ms"] * r["calls_per_iteration"],
            "share_pct": r["share_pct"],
            "detail": r["module_type"],
        }
        for r in table.to_pylist()
    ]
    return rows, "Layers by forward host time (no GPU run)"


def measured_gains(root: Path) -> dict[str, str]:
    """Each verified rule's measured gain as a phrase (or, not measured, its status), from
    ``root/verify/verify.json`` (``xsp verify``); empty where it did not run or cannot be read."""
    path = root.joinpath(*VERIFY_FILE)
    try:
        rows = json.loads(path.read_text(encoding="utf-8")).get("rows", [])
    except (OSError, ValueError, AttributeError):
        return {}
    said = {}
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or "rule" not in row:
            continue
        gain = row.get("measured_gain_ms_per_iteration")
        if isinstance(gain, (int, float)):
            ci = row.get("measured_gain_ci_ms")
            span = (
                f" (95% CI {ci[0]:.2f} to {ci[1]:.2f})"
                if isinstance(ci, list)
                and len(ci) == 2
                and all(isinstance(v, (int, float)) for v in ci)
                else ""
            )
            said[row["rule"]] = f"measured {gain:.2f} ms/iteration{span}"
        elif row.get("status"):
            said[row["rule"]] = f"verify: {row['status']}"
    return said


def answer_html(found: Answer) -> str:
    """The first screen as HTML (``ANSWER_STYLE``): a grid of two columns under the verdict."""
    e = html.escape
    checks = "".join(f"<p class='checks'>{e(line)}</p>" for line in found.checks)
    left = [f"<div><h3 id='causes'>Where the step goes</h3>{checks}{_causes(found.causes)}</div>"]
    right = [f"<div><h3 id='top-suggestions'>What to do</h3>{_suggestions(found.suggestions)}"]
    if found.layers:
        right.append(f"<h3 id='top-layers'>{e(found.layers_title)}</h3>{_layers_html(found)}")
    right.append("</div>")
    warnings = (
        "<ul id='warnings'>" + "".join(f"<li>⚠ {e(w)}</li>" for w in found.warnings) + "</ul>"
        if found.warnings
        else ""
    )
    return (
        f"<section id='answer'><p id='verdict'>{e(found.verdict)}</p>{warnings}"
        f"{''.join(left)}{''.join(right)}</section>"
    )


def _causes(causes: list[Row]) -> str:
    if not causes:
        return "<p class='checks'>no critical path to split by cause</p>"
    rows = "".join(
        f"<tr><td>{html.escape(r['cause'])}</td><td class='num'>{r['ms_per_iteration']:.3f} ms"
        f"</td><td class='num'>{r['share_pct']:.1f}%</td><td><span class='bar' "
        f"style='width:{max(1, round(r['share_pct']))}px'></span></td></tr>"
        for r in causes
    )
    return f"<table class='answer'>{rows}</table>"


def _suggestions(rows: list[Row]) -> str:
    if not rows:
        return "<p class='checks'>no rule fired: nothing to suggest from this measurement</p>"
    items = []
    for r in rows:
        gain = r["gain_ms_per_iteration"]
        estimated = (
            f"estimated {gain:.2f} ms/iteration"
            + (f" ({r['share_pct']:.1f}% of the step)" if r["share_pct"] is not None else "")
            if gain is not None
            else "gain not estimated"
        )
        measured = f"; {html.escape(r['measured'])}" if r["measured"] else ""
        items.append(
            f"<li title='{html.escape(r['evidence'] or '')}'><b>{html.escape(r['advice'])}</b>"
            f"<br><span class='checks'>{estimated}{measured}</span></li>"
        )
    return f"<ol style='margin:.2em 0;padding-left:1.3em'>{''.join(items)}</ol>"


def _layers_html(found: Answer) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(r['layer'])}</td><td class='num'>{r['ms']:.3f} ms</td>"
        f"<td class='num'>{_pct(r['share_pct'])}</td>"
        f"<td class='checks'>{html.escape(str(r['detail']))}</td></tr>"
        for r in found.layers
    )
    return f"<table class='answer'>{rows}</table>"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}%"
