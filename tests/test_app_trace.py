"""Spans that join the application's own OpenTelemetry trace (xsp.tracer.capture.hooks.context), on
CPU with a tiny model inside spans of a real OpenTelemetry SDK tracer."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

import xsp
from tests.conftest import reachable_from_root
from tests.test_cli import xsp as xsp_cli
from xsp.core import schema
from xsp.core.otlp import request_to_json, table_from_resource_spans
from xsp.tracer.export.otlp_layout import encode_request, encode_request_json
from xsp.tracer.export.sinks import InMemorySink


def _mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model, torch.randn(3, 8)


def _serve(
    tracer_provider: TracerProvider | None, requests: int = 3
) -> tuple[Any, InMemorySink, list[Any]]:
    """Three requests, each an application span (when a provider is given) around one marked
    iteration; (the session, its spans, the request spans' contexts)."""
    model, x = _mlp()
    sink = InMemorySink()
    contexts = []
    with xsp.session("MF", iterations=requests, warmup=0, sinks=[sink], device="cpu") as s:
        for _ in range(requests):
            if tracer_provider is None:
                with xsp.iteration(), torch.no_grad():
                    model(x)
                continue
            tracer = tracer_provider.get_tracer("app")
            with tracer.start_as_current_span("request") as span, xsp.iteration():
                contexts.append(span.get_span_context())
                with torch.no_grad():
                    model(x)
    return s, sink, contexts


def _by_iteration(table: pa.Table) -> dict[int, list[dict]]:  # type: ignore[type-arg]
    rows: dict[int, list[dict]] = {}  # type: ignore[type-arg]
    for row in table.to_pylist():
        rows.setdefault(row["iteration"], []).append(row)
    return rows


def test_model_spans_join_the_request_span_they_ran_in() -> None:
    session, sink, contexts = _serve(TracerProvider())
    table = sink.table()
    assert session.result is not None and session.result["status"] == "ok"
    for it, rows in _by_iteration(table).items():
        app = contexts[it]
        trace = app.trace_id.to_bytes(16, "big")
        assert {r["trace_id"] for r in rows} == {trace}  # every level follows the model span
        (step,) = [r for r in rows if r["kind"] == "step"]
        assert step["remote_parent_span_id"] == app.span_id and step["parent_span_id"] == 0
        assert all(r["remote_parent_span_id"] is None for r in rows if r["kind"] != "step")
        assert len(rows) > 4  # layers and ops too
    assert reachable_from_root(table)  # xsp's own tree keeps its root
    # on the wire, the model span is the request span's child; decoded, it is a root again
    wire = encode_request_json(sink.batches[0].resource, table)
    spans = {s["spanId"]: s for s in wire["resourceSpans"][0]["scopeSpans"][0]["spans"]}
    for step in (r for r in table.to_pylist() if r["kind"] == "step"):
        app = contexts[step["iteration"]]
        assert spans[f"{step['span_id']:016x}"]["parentSpanId"] == f"{app.span_id:016x}"
    request = encode_request(sink.batches[0].resource, table)
    assert request_to_json(request) == wire
    back = table_from_resource_spans(request.resource_spans[0])
    assert (
        back.column("remote_parent_span_id").to_pylist()
        == table.column("remote_parent_span_id").to_pylist()
    )
    assert back.column("parent_span_id").to_pylist() == table.column("parent_span_id").to_pylist()


@pytest.mark.parametrize("provider", [None, TracerProvider(sampler=ALWAYS_OFF)])
def test_without_a_sampled_request_span_xsp_keeps_its_own_trace_ids(
    provider: TracerProvider | None,
) -> None:
    session, sink, _ = _serve(provider)
    table = sink.table()
    for it, rows in _by_iteration(table).items():
        own = schema.trace_id_for(session.run_id, "MF", it)
        assert {r["trace_id"] for r in rows} == {own}
    assert table.column("remote_parent_span_id").null_count == table.num_rows


SERVICE = """
    import sys
    import torch
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())
    tracer = trace.get_tracer("service")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for _ in range(7):
            with tracer.start_as_current_span("request"):
                model(torch.randn(1, 8))
"""

PLAIN = """
    import sys
    import torch

    model = torch.nn.Linear(8, 4)
    with torch.no_grad():
        for _ in range(7):
            model(torch.randn(1, 8))
    print("otel imported:", "opentelemetry.trace" in sys.modules)
"""


def _measure(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "service.py"
    script.write_text(textwrap.dedent(text))
    base = ("run", "--levels", "M,MF", "--iterations", "3", "--warmup", "1", "--device", "cpu")
    return xsp_cli(*base, "--out", str(tmp_path / "R"), "--", "python", str(script))


def test_a_reconstruction_keeps_its_own_ids_and_links_the_request(tmp_path: Path) -> None:
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.reconstruction.reconstruct import reconstruct

    done = _measure(tmp_path, SERVICE)
    assert done.returncode == 0, done.stderr
    store = MeasurementStore(tmp_path / "R")
    model_run = next(i for i, r in enumerate(store.runs) if r.levels == "M")
    m_steps = {
        r["iteration"]: r for r in store.run_spans(model_run).to_pylist() if r["kind"] == "step"
    }
    assert all(s["remote_parent_span_id"] for s in m_steps.values())
    spans, _ = reconstruct(store)
    rows = spans.to_pylist()
    roots = [r for r in rows if r["parent_span_id"] == 0]
    assert len(roots) == 3
    for root in roots:
        step = m_steps[root["iteration"]]
        assert (root["link_trace_id"], root["link_span_id"]) == (
            step["trace_id"],
            step["remote_parent_span_id"],
        )
        assert root["trace_id"] != step["trace_id"]  # its own trace
    assert all(r["remote_parent_span_id"] is None for r in rows)
    assert sum(r["link_span_id"] is not None for r in rows) == 3
    # the link travels in the OTLP export of the reconstruction
    exported = xsp_cli("export", str(tmp_path / "R"), "--reconstructed", "--format", "otlp-json")
    assert exported.returncode == 0, exported.stderr
    links = [
        link
        for line in exported.stdout.splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
        for link in span.get("links", [])
    ]
    assert sorted(link["spanId"] for link in links) == sorted(
        f"{s['remote_parent_span_id']:016x}" for s in m_steps.values()
    )


def test_xsp_never_imports_the_opentelemetry_api_into_a_program(tmp_path: Path) -> None:
    done = _measure(tmp_path, PLAIN)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("otel imported: False") == 2


LOGGING = """
    import logging
    import torch

    logging.basicConfig(level=logging.INFO, format="app %(levelname)s %(message)s")
    logging.getLogger("app").info("configured by the program")
    logging.getLogger("opentelemetry.exporter").warning("export failed")
    model = torch.nn.Linear(8, 4)
    with torch.no_grad():
        for _ in range(7):
            model(torch.randn(1, 8))
"""


def test_the_programs_own_logging_stays_its_own(tmp_path: Path) -> None:
    """xsp's log handler sits on xsp's loggers: the program's basicConfig takes effect, and a
    library's warning (an OTLP exporter's, say) is not prefixed as if xsp said it."""
    done = _measure(tmp_path, LOGGING)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines.count("app INFO configured by the program") == 2  # one per level set
    assert lines.count("app WARNING export failed") == 2
    assert not any(line.startswith("xsp: ") and "export failed" in line for line in lines)
