"""``xsp campaign report``: one HTML page comparing every job of a campaign, in the style of
XSP's section IV: a per-model table, convolution's share of the latency across models, which
workloads are launch-bound or compute-bound at each batch size, and batch-scaling curves, with
links to each run's own report."""

from __future__ import annotations

import html
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from campaign.store import CampaignStore
from campaign.summary import shares_text

RUN_REPORT = "report.html"


def optimal_batches(results: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """(model, mode) -> the batch size with the highest throughput (XSP's A1 optimal batch)."""
    best: dict[tuple[str, str], tuple[float, int]] = {}
    for r in results:
        throughput = (r.get("summary") or {}).get("throughput_per_s")
        if r.get("status") != "ok" or not throughput:
            continue
        key = (r["model"], r["mode"])
        if key not in best or throughput > best[key][0]:
            best[key] = (throughput, r["batch_size"])
    return {key: batch for key, (_, batch) in best.items()}


def write_run_reports(store: CampaignStore, results: list[dict[str, Any]], workers: int) -> None:
    """Each successful job's own ``xsp analyze --report``, made once (kept across reruns)."""
    todo = [
        store.runs_dir / r["job"]
        for r in results
        if r.get("status") == "ok" and not (store.runs_dir / r["job"] / RUN_REPORT).exists()
    ]

    def one(run_dir: Path) -> None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "xsp",
                "analyze",
                str(run_dir),
                "--report",
                str(run_dir / RUN_REPORT),
            ],
            capture_output=True,
            check=False,
        )

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(one, todo))


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, list):
        return shares_text(value)
    return str(value)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_campaign_report(store: CampaignStore, out: Path, run_reports: bool = True) -> int:
    """Write the report; return the number of jobs it covers."""
    import plotly.graph_objects as go

    spec = store.spec()
    results = store.results()
    if run_reports:
        write_run_reports(store, results, os.cpu_count() or 1)
    ok = [r for r in results if r.get("status") == "ok"]
    best = optimal_batches(results)
    rows = []
    for r in sorted(results, key=lambda r: (r["model"], r["mode"], r["batch_size"])):
        s = r.get("summary") or {}
        monitor = s.get("monitor") or {}
        link = store.runs_dir / r["job"] / RUN_REPORT
        name = html.escape(r["model"])
        if link.exists():
            href = os.path.relpath(link.resolve(), out.parent.resolve())
            name = f"<a href='{html.escape(href)}'>{name}</a>"
        rows.append(
            [
                name,
                r["mode"],
                str(r["batch_size"]),
                r.get("status", "")
                + (f": {html.escape(r.get('reason') or '')}" if r.get("status") != "ok" else ""),
                _fmt(s.get("latency_ms"), 3),
                _fmt(s.get("throughput_per_s"), 1),
                "yes" if best.get((r["model"], r["mode"])) == r["batch_size"] else "",
                _fmt(s.get("gpu_busy_pct"), 1),
                _fmt(s.get("bound")),
                html.escape(_fmt(s.get("top_layer_types"))),
                html.escape(_fmt(s.get("top_kernels"))[:160]),
                _fmt(monitor.get("sm_active_pct"), 1),
                _fmt(monitor.get("utilization_pct"), 1),
                html.escape(", ".join(s.get("suggestions") or [])),
                _fmt(r.get("wall_s"), 1),
            ]
        )
    headers = [
        "model",
        "mode",
        "batch",
        "status",
        "latency ms",
        "items/s",
        "optimal batch",
        "GPU busy %",
        "bound",
        "top layer types",
        "top kernels",
        "SM active %",
        "NVML util %",
        "suggestions",
        "job s",
    ]
    figures = []
    largest: dict[tuple[str, str], dict[str, Any]] = {}
    for r in ok:
        key = (r["model"], r["mode"])
        if key not in largest or r["batch_size"] > largest[key]["batch_size"]:
            largest[key] = r
    conv = sorted(largest.values(), key=lambda r: -(r["summary"].get("conv_share_pct") or 0))
    figures.append(
        (
            "Convolution's share of layer latency (largest batch of each model)",
            go.Figure(
                go.Bar(
                    x=[f"{r['model']} ({r['mode']})" for r in conv],
                    y=[r["summary"].get("conv_share_pct") or 0 for r in conv],
                )
            ),
        )
    )
    bound = [r for r in ok if r["summary"].get("gpu_busy_pct") is not None]
    if bound:
        colors = {"launch-bound": "crimson", "compute-bound": "seagreen", "mixed": "orange"}
        figures.append(
            (
                "Launch-bound or compute-bound: GPU busy share of the true step, by batch size",
                go.Figure(
                    go.Scatter(
                        x=[r["batch_size"] for r in bound],
                        y=[r["summary"]["gpu_busy_pct"] for r in bound],
                        mode="markers",
                        text=[
                            f"{r['model']} {r['mode']}: {r['summary'].get('bound')}" for r in bound
                        ],
                        marker={
                            "color": [colors.get(r["summary"].get("bound"), "grey") for r in bound]
                        },
                    )
                )
                .update_xaxes(type="log", title="batch size")
                .update_yaxes(title="GPU busy %"),
            )
        )
    scaling = go.Figure()
    for model, mode in sorted({(r["model"], r["mode"]) for r in ok}):
        points = sorted(
            (r["batch_size"], r["summary"]["throughput_per_s"])
            for r in ok
            if r["model"] == model and r["mode"] == mode and r["summary"].get("throughput_per_s")
        )
        if points:
            scaling.add_trace(
                go.Scatter(
                    x=[p[0] for p in points],
                    y=[p[1] for p in points],
                    mode="lines+markers",
                    name=f"{model} ({mode})",
                )
            )
    scaling.update_xaxes(type="log", title="batch size").update_yaxes(type="log", title="items/s")
    figures.append(("Batch scaling: throughput against batch size", scaling))
    parts = [
        f"<h1>Campaign {html.escape(spec.name)}</h1>",
        f"<p>{len(ok)} of {len(results)} jobs ok; device {html.escape(spec.device)}; level sets "
        f"{', '.join(spec.level_sets)}; {spec.iterations} iterations after {spec.warmup} "
        "warm-up.</p>",
        "<h2>Per model</h2>",
        _table(headers, rows),
    ]
    for index, (title, figure) in enumerate(figures):
        figure.update_layout(height=450, margin={"t": 30, "l": 5, "r": 5, "b": 5})
        parts.append(f"<h2>{html.escape(title)}</h2>")
        parts.append(figure.to_html(full_html=False, include_plotlyjs=(index == 0)))
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(spec.name)}</title><style>body{{font-family:sans-serif;margin:1.5em}}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
        "padding:3px 6px;text-align:left;vertical-align:top}</style></head>"
        f"<body>{''.join(parts)}</body></html>"
    )
    out.write_text(page, encoding="utf-8")
    return len(results)
