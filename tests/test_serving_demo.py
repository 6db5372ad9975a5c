"""The demo service (examples/serving) end to end: the OpenTelemetry-instrumented HTTP inference
server runs under `xsp run --levels MFL` unmodified, its bounded load client sends a few
requests, and a real Jaeger (with its web UI) receives the application's request spans and xsp's
spans over OTLP. One trace per measured request holds HTTP -> model step -> layers -> ops ->
oneDNN calls, with the times xsp stored; the trace page shows it in a real browser. Also the
server's request spans alone: the caller's W3C traceparent and the answer's status."""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import free_ports
from tests.test_jaeger import JAEGER_BIN, JAEGER_UI, Jaeger
from xsp.core import store

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "examples/serving/server.py"
LOAD = ROOT / "examples/serving/load.py"
MODEL = "torchvision:mobilenet_v3_small"  # small: about 150 layer and 1,200 op spans a request
INPUT_BYTES = 3 * 224 * 224
WARMUP, MEASURED, REQUESTS = 1, 2, 3  # the service stops after its third prediction


def _exporter() -> None:
    """The service's OTLP exporter (the dev extra installs it); skips without it, except under
    CI, where it must run."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
    except ImportError:
        reason = "needs opentelemetry-exporter-otlp-proto-http (pip install -e '.[dev]')"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


def _env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        **extra,
    }


@dataclass
class Served:
    jaeger: Jaeger
    run_dir: Path  # the MFL run's directory
    load: dict[str, Any]  # the load client's figures
    bad_request: str  # the answer to a request with an image of the wrong size


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Jaeger, and the demo service measured under xsp (MFL, 1 warm-up and 2 measured requests)
    once its load has been sent and it has stopped."""
    _exporter()
    if not JAEGER_BIN.exists() or not (JAEGER_UI / "index.html").exists():
        reason = f"needs Jaeger and its UI at {JAEGER_BIN.parent}: run scripts/build-jaeger.sh"
        if os.environ.get("CI"):
            pytest.fail(reason + " (CI builds it in .ci/run)")
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("serving")
    jaeger = Jaeger(work)
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    env = _env(OTEL_EXPORTER_OTLP_ENDPOINT=jaeger.otlp_http, COLUMNS="120")
    xsp_run = ("run", "--levels", "MFL", "--device", "cpu", "--out", str(work / "R"))
    counts = ("--iterations", str(MEASURED), "--warmup", str(WARMUP))
    serve = ("--model", MODEL, "--port", str(port), "--max-requests", str(REQUESTS))
    service = subprocess.Popen(
        [sys.executable, "-m", "xsp", *xsp_run, *counts, "--", "python", str(SERVER), *serve],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its level-set process too is ended on a failure
    )
    try:
        load_options = ("--concurrency", "2", "--json", "--wait", "300")
        bad = asyncio.run(_post_when_ready(url, b"\0" * 10))  # refused: no prediction
        load = subprocess.run(
            [sys.executable, str(LOAD), "--url", url, "--requests", str(REQUESTS), *load_options],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert load.returncode == 0, load.stderr
        output, _ = service.communicate(timeout=600)
        assert service.returncode == 0, output
        yield Served(jaeger, work / "R" / "MFL", json.loads(load.stdout), bad)
    finally:
        if service.poll() is None:
            os.killpg(service.pid, signal.SIGKILL)
            service.wait()
        jaeger.stop()


async def _post_when_ready(url: str, body: bytes) -> str:
    """POST ``body`` to /predict once the service answers; "status text"."""
    import aiohttp

    from examples.serving.load import wait_ready

    async with aiohttp.ClientSession() as session:
        await wait_ready(session, url, wait_s=300)
        async with session.post(f"{url}/predict", data=body) as answer:
            return f"{answer.status} {(await answer.text()).strip()}"


def _legacy_trace(jaeger: Jaeger, trace_id: str, expected: int) -> dict[str, Any]:
    """The trace as Jaeger's UI reads it (the v1 API), once ``expected`` spans have arrived."""
    deadline = time.time() + 60
    trace: dict[str, Any] = {"spans": []}
    while time.time() < deadline:
        data = jaeger.get(f"/api/traces/{trace_id}").get("data") or []
        if data and len(data[0]["spans"]) >= expected:
            return dict(data[0])
        trace = data[0] if data else trace
        time.sleep(0.3)
    raise AssertionError(f"trace {trace_id}: {len(trace['spans'])} of {expected} spans arrived")


def _tag(span: dict[str, Any], key: str) -> Any:
    return next((t["value"] for t in span.get("tags", []) if t["key"] == key), None)


def _parent(span: dict[str, Any]) -> str | None:
    return next((r["spanID"] for r in span["references"] if r["refType"] == "CHILD_OF"), None)


def _zero_length_warning(span: dict[str, Any]) -> bool:
    warnings = span["warnings"]
    return (
        len(warnings) == 1 and warnings[0].startswith("Negative duration") and not span["duration"]
    )


def _measured_steps(run_dir: Path) -> dict[int, dict[str, Any]]:
    spans = store.open_run(run_dir).spans()
    return {r["iteration"]: r for r in spans.to_pylist() if r["kind"] == "step"}


def test_each_measured_request_is_one_trace_from_http_to_onednn_with_stored_times(
    served: Served,
) -> None:
    assert served.load["requests"] == REQUESTS and served.load["failed"] == 0
    assert served.load["p50_ms"] <= served.load["p99_ms"]
    assert served.bad_request.startswith("400 expected 150528 bytes (3x224x224 uint8 RGB")
    stored = store.open_run(served.run_dir).spans().to_pylist()
    steps = _measured_steps(served.run_dir)
    assert sorted(steps) == list(range(MEASURED))
    request_spans = set()
    for step in steps.values():
        rows = {r["span_id"]: r for r in stored if r["trace_id"] == step["trace_id"]}
        trace = _legacy_trace(served.jaeger, step["trace_id"].hex(), len(rows) + 1)
        services = {k: p["serviceName"] for k, p in trace["processes"].items()}
        spans = {s["spanID"]: s for s in trace["spans"]}
        assert len(spans) == len(rows) + 1  # xsp's spans and the request's own
        # Jaeger's only complaint: a span of zero length (a oneDNN execution shorter than its
        # verbose clock's resolution, stored as measured) it draws 1 ns long
        warned = {k for k, s in spans.items() if s.get("warnings")}
        assert all(_zero_length_warning(spans[k]) for k in warned), [spans[k] for k in warned]
        assert {int(k, 16) for k in warned} <= {i for i, r in rows.items() if r["dur_ns"] == 0}
        # the request's server span is the root; xsp's model step is its child
        (root,) = [s for s in spans.values() if not s["references"]]
        assert services[root["processID"]] == "serving-demo"
        assert root["operationName"] == "POST /predict"
        assert (_tag(root, "span.kind"), _tag(root, "http.response.status_code")) == ("server", 200)
        assert int(root["spanID"], 16) == step["remote_parent_span_id"]
        model = spans[f"{step['span_id']:016x}"]
        assert _parent(model) == root["spanID"] and services[model["processID"]] == "xsp.model"
        # it ran inside the request, on the same clock
        assert root["startTime"] <= model["startTime"]
        assert model["startTime"] + model["duration"] <= root["startTime"] + root["duration"]
        request_spans.add(root["spanID"])
        # every xsp span as stored: its parent, start and duration (microseconds in this API)
        for span_id, row in rows.items():
            span = spans[f"{span_id:016x}"]
            parent = row["parent_span_id"] or row["remote_parent_span_id"]
            assert _parent(span) == f"{parent:016x}"
            assert span["startTime"] == row["start_ns"] // 1000
            assert span["duration"] == row["dur_ns"] // 1000
        # a oneDNN call under an op under a layer under the model step under the request
        onednn = [s for s in spans.values() if _tag(s, "xsp.library.name") == "oneDNN"]
        assert onednn and {services[s["processID"]] for s in onednn} == {"xsp.library"}
        chain = []  # from the request down to the oneDNN call
        span: dict[str, Any] | None = onednn[0]
        while span is not None:
            chain.insert(0, span)
            parent_id = _parent(span)
            span = spans[parent_id] if parent_id else None
        kinds = [_tag(s, "xsp.kind") for s in chain]
        assert kinds[:3] == [None, "step", "module"] and kinds[-1] == "library_call"
        assert "op" in kinds[kinds.index("module") :]
        assert [services[s["processID"]] for s in chain[:3]] == [
            "serving-demo", "xsp.model", "xsp.framework"
        ]  # fmt: skip
    assert len(request_spans) == MEASURED  # one request each
    # the warm-up request and the bad one are traced by the service alone
    found = served.jaeger.get("/api/traces?service=serving-demo&operation=POST%20%2Fpredict")
    sizes = sorted(len(t["spans"]) for t in found["data"])
    assert sizes[: REQUESTS + 1 - MEASURED] == [1] * (REQUESTS + 1 - MEASURED)
    assert len(sizes) == REQUESTS + 1


def test_the_trace_page_shows_the_request_above_the_stack_in_a_browser(served: Served) -> None:
    """Jaeger's own UI draws the request's trace: the HTTP span first, the model step under it,
    then a layer, its ops and a oneDNN call, each level in its own service, no warnings."""
    from tests.browser import dump_dom

    step = _measured_steps(served.run_dir)[0]
    trace_id = step["trace_id"].hex()
    dom = dump_dom(f"{served.jaeger.query}/trace/{trace_id}", size="1400,3000")
    assert "not the Jaeger UI" not in dom
    names = [html.unescape(n) for n in re.findall(r'class="endpoint-name">([^<]*)<', dom)]
    assert names[0] == "POST /predict"
    assert names[1].endswith("· MFL (traced)") and "server.py" in names[1]
    assert names[2:5] == ["MobileNetV3", "features", "features.0"]
    for wanted in ("features.0.0", "aten::conv2d", "aten::mkldnn_convolution"):
        assert wanted in names, wanted
    assert {"convolution", "reorder"} & set(names)  # oneDNN's primitives
    for service in ("serving-demo", "xsp.model", "xsp.framework", "xsp.library"):
        assert service in dom, service
    assert "clock skew" not in dom.lower() and "invalid parent" not in dom.lower()


# -- the server's request spans, without xsp ----------------------------------------------------


def _request_spans(headers: dict[str, str], path: str) -> tuple[int, list[Any]]:
    """Serve one request through the demo's span middleware, with an in-memory exporter."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from examples.serving.server import server_spans

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def bad(request: web.Request) -> web.Response:
        raise web.HTTPBadRequest(text="no")

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("boom")

    async def call() -> int:
        app = web.Application(middlewares=[server_spans(provider.get_tracer("test"))])
        app.add_routes([web.post("/ok", ok), web.post("/bad", bad), web.post("/broken", broken)])
        async with TestClient(TestServer(app)) as client:
            response = await client.post(path, headers=headers)
            return response.status

    status = asyncio.run(call())
    return status, list(exporter.get_finished_spans())


def test_a_request_span_continues_the_callers_trace_from_its_traceparent() -> None:
    from opentelemetry.trace import SpanKind, StatusCode

    caller = "0af7651916cd43dd8448eb211c80319c"
    status, (span,) = _request_spans({"traceparent": f"00-{caller}-b7ad6b7169203331-01"}, "/ok")
    assert status == 200
    assert f"{span.context.trace_id:032x}" == caller
    assert span.parent is not None and f"{span.parent.span_id:016x}" == "b7ad6b7169203331"
    assert span.parent.is_remote and span.kind is SpanKind.SERVER
    assert span.name == "POST /ok"
    assert span.attributes["http.response.status_code"] == 200
    assert span.status.status_code is StatusCode.UNSET
    _, (fresh,) = _request_spans({}, "/ok")
    assert fresh.parent is None and fresh.context.trace_id != span.context.trace_id


def test_a_request_span_records_the_answers_status() -> None:
    from opentelemetry.trace import StatusCode

    status, (bad,) = _request_spans({}, "/bad")
    assert status == 400 and bad.attributes["http.response.status_code"] == 400
    assert bad.status.status_code is StatusCode.UNSET  # a client's error is not the server's
    status, (broken,) = _request_spans({}, "/broken")
    assert status == 500 and broken.attributes["http.response.status_code"] == 500
    assert broken.status.status_code is StatusCode.ERROR
    assert broken.status.description == "RuntimeError: boom"
    assert [e.name for e in broken.events] == ["exception"]
