"""The flame view and the timeline of the replayed step as report HTML: the step's boxes as one
embedded JSON document (``views.StepView.to_json``) and ``step_view.js``, which draws both on
canvases once they come near the window. Self-contained: no script or data from elsewhere."""

from __future__ import annotations

import html
import json
from pathlib import Path

from xsp.analysis.figures.views import LEVEL_COLOURS, PHASE_COLOUR, StepView
from xsp.core.schema import LEVEL_GPU

__all__ = ["STEP_STYLE", "step_html"]

STEP_STYLE = """
.xsp-view{position:relative;margin:.3em 0 1em}
.xsp-view .bar{font-size:13px;margin:.2em 0}
.xsp-view button{font-size:12px;border:1px solid #adb5bd;background:#f8f9fa;border-radius:3px;
  padding:1px 8px;cursor:pointer}
.xsp-view button.on{background:#343a40;color:#fff}
.xsp-canvas{position:relative;width:100%}
.xsp-tip{display:none;position:absolute;z-index:5;max-width:400px;background:#fff;
  border:1px solid #868e96;padding:4px 6px;font-size:12px;overflow-wrap:anywhere;
  pointer-events:none;box-shadow:0 1px 4px #0003}
"""

SCRIPT = (Path(__file__).with_name("step_view.js")).read_text(encoding="utf-8")


def _legend(gpu: bool) -> str:
    swatches = [
        f"<span style='display:inline-block;width:.9em;height:.9em;background:{colour};"
        f"margin:0 .3em 0 1em;vertical-align:middle'></span>{level}"
        for level, colour in [*LEVEL_COLOURS.items(), ("phase group", PHASE_COLOUR)]
        if gpu or level != LEVEL_GPU
    ]
    return f"Levels:{''.join(swatches)}"


def _caption(view: StepView, gpu: bool) -> str:
    which = f"Step {view.iteration}" + (f", rank {view.rank}" if view.rank >= 0 else "")
    notes = [
        f"{which}, replayed without the tracer (the median step, {view.step_ns / 1e6:.3f} ms)"
        + (
            "; its GPU activities, timed by the G run, under the launch call, op and layer "
            "that launched them."
            if gpu
            else "."
        )
    ]
    if view.left_out:
        notes.append(
            f"{view.left_out:,} host spans shorter than {view.threshold_ns / 1e3:.1f} µs left out "
            "(the timeline has them)."
        )
    if view.beside:
        notes.append(f"{view.beside:,} spans on threads running beside them left out (timeline).")
    return " ".join(notes)


def step_html(view: StepView, mode: str) -> tuple[str, str]:
    """(the flame view's HTML, the timeline's HTML); ``mode`` the flame's width at first:
    ``"gpu"`` (GPU time) or ``"host"`` (step time). The data and script come with the
    flame's part."""
    data = json.dumps(view.to_json(mode), separators=(",", ":")).replace("</", "<\\/")
    gpu = LEVEL_GPU in view.levels
    modes = (
        "Width: <button data-mode='host'>step time</button> "
        "<button data-mode='gpu'>GPU time</button> "
        if gpu
        else "<button data-mode='host' hidden>step time</button>"
    )
    flame = (
        f"<p class='note'>{html.escape(_caption(view, gpu))} Click a box to zoom to it, double-click "
        "to see it all, drag to pan, Ctrl + wheel to zoom.</p>"
        f"<div class='xsp-view' id='xsp-flame'><p class='bar'>{modes}"
        f"<button class='reset'>reset zoom</button> {_legend(gpu)}</p>"
        "<div class='xsp-canvas'></div></div>"
    )
    links = (
        " Hover a kernel to outline the call that launched it (an arrow from the call's end), "
        "or a span to outline every kernel launched below it."
        if gpu
        else ""
    )
    timeline = (
        "<p class='note'>The same step: a lane per host thread (a row per nesting depth)"
        f"{' and per GPU stream' if gpu else ''}, in time.{links}</p>"
        "<div class='xsp-view' id='xsp-timeline'><p class='bar'>"
        "<button class='reset'>reset zoom</button> <label"
        f"{'' if gpu else ' hidden'}><input type='checkbox' class='arrows'> every launch → "
        "kernel arrow in view</label></p>"
        "<div class='xsp-canvas'></div></div>"
        f"<script type='application/json' id='xsp-step-data'>{data}</script>"
        f"<script>{SCRIPT}</script>"
    )
    return flame, timeline
