"""End to end against a real Jaeger v2 with its web UI (both built by scripts/build-jaeger.sh): a
stored run pushed straight to Jaeger over OTLP/HTTP, and another through the xsp collector, which
forwards over OTLP/gRPC, both read back through Jaeger's APIs; the committed H200 MFLG measurement
and its reconstruction, whose times Jaeger must show as recorded; and the trace page in a real
browser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from tests.fixtures import fixture_table, free_ports, http_collector, write_run
from xsp.core import schema, store

ROOT = Path(__file__).resolve().parents[1]
JAEGER_BIN = Path(
    os.environ.get("XSP_JAEGER_BIN", Path.home() / ".cache/xsp/jaeger-v1.76.0/jaeger")
)
JAEGER_UI = JAEGER_BIN.parent / "ui"
MEASUREMENT = ROOT / "benchmarks/data/r50-b64-train"


class Jaeger:
    """Jaeger with deploy/jaeger.yaml on free loopback ports, its Badger store in ``data``
    (default ``work/badger``): a new Jaeger on the same ``data`` is a restart."""

    def __init__(self, work: Path, data: Path | None = None) -> None:
        grpc, http, query, query_grpc, health = free_ports(5)
        self.otlp_grpc = f"127.0.0.1:{grpc}"
        self.otlp_http = f"http://127.0.0.1:{http}"
        self.query = f"http://127.0.0.1:{query}"
        env = {
            **os.environ,
            "JAEGER_OTLP_GRPC": self.otlp_grpc,
            "JAEGER_OTLP_HTTP": f"127.0.0.1:{http}",
            "JAEGER_QUERY_HTTP": f"127.0.0.1:{query}",
            "JAEGER_QUERY_GRPC": f"127.0.0.1:{query_grpc}",
            "JAEGER_HEALTH": f"127.0.0.1:{health}",
            "JAEGER_LOG_LEVEL": "warn",
            "JAEGER_UI_ASSETS": str(JAEGER_UI),
            "JAEGER_BADGER_DIR": str(data or work / "badger"),
        }
        self.link = ""  # what ``xsp push`` printed (the ``pushed`` fixture)
        self.log = (work / "jaeger.log").open("ab")
        self.proc = subprocess.Popen(
            [str(JAEGER_BIN), "--config", str(ROOT / "deploy/jaeger.yaml")],
            cwd=work,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/status", timeout=1) as r:
                    if json.load(r).get("healthy"):
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise AssertionError(f"Jaeger did not become healthy; see {work / 'jaeger.log'}")

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.query + path, timeout=10) as response:
            return json.load(response)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # seen once under a full run: its shutdown hung
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.log.close()


def _need_jaeger() -> None:
    if not JAEGER_BIN.exists() or not (JAEGER_UI / "index.html").exists():
        reason = f"needs Jaeger and its UI at {JAEGER_BIN.parent}: run scripts/build-jaeger.sh"
        if os.environ.get("CI"):
            pytest.fail(reason + " (CI builds it in .ci/run)")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    _need_jaeger()
    server = Jaeger(tmp_path_factory.mktemp("jaeger"))
    yield server
    server.stop()


def _measurement(root: Path, run_id: str) -> dict[str, int]:
    """A stored two-level-set measurement (M and MF) from the real ResNet-18 capture; returns
    the span count of each trace (hex trace id)."""
    tables = {levels: fixture_table("resnet18_train_cpu", levels, run_id) for levels in ("M", "MF")}
    counts = {}
    for levels, table in tables.items():
        resource = {
            schema.RES_SERVICE_NAME: "xsp",
            schema.RES_HOST_NAME: "e2e-host",
            schema.RES_RUN_ID: f"{run_id}-{levels}",
            schema.RES_MEASUREMENT_ID: run_id,
            schema.RES_LEVELS: levels,
            schema.RES_WORKLOAD: "torchvision:resnet18",
        }
        write_run(root, levels, table, resource)
        for trace_id in set(table.column("trace_id").to_pylist()):
            counts[trace_id.hex()] = sum(
                1 for t in table.column("trace_id").to_pylist() if t == trace_id
            )
    return counts


def _push(run_dir: Path, endpoint: str, *extra: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "xsp", "push", str(run_dir), "--endpoint", endpoint, *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    return done


def _read_back(
    jaeger: Jaeger, trace_id: str, expected: int, stored: bool = False
) -> list[dict[str, Any]]:
    deadline = time.time() + 30
    spans: list[dict[str, Any]] = []
    while time.time() < deadline:
        try:
            data = jaeger.get(f"/api/v3/traces/{trace_id}")
            spans = [
                s
                for rs in data["result"]["resourceSpans"]
                for ss in rs["scopeSpans"]
                for s in ss.get("spans", [])
            ]
            if _complete(spans, expected, stored):
                break
        except OSError:
            pass
        time.sleep(0.3)
    return spans


def _complete(spans: list[dict[str, Any]], expected: int, stored: bool) -> bool:
    """``expected`` spans arrived (the stored ones alone where ``stored``), and the parent of
    every one: Jaeger ingests a push in batches, so a layer's backward span, which the layout
    adds, can come after its children."""
    ids = {s["spanId"] for s in spans}
    parents_in = all(s["parentSpanId"] in ids for s in spans if s.get("parentSpanId"))
    arrived = sum(not _added(s) for s in spans) if stored else len(spans)
    return parents_in and arrived >= expected


def _attr(span: dict[str, Any], key: str) -> Any:
    for kv in span.get("attributes", []):
        if kv["key"] == key:
            return next(iter(kv["value"].values()))
    return None


def _added(span: dict[str, Any]) -> bool:
    """A span of the layout for viewers (a layer's backward span), which no store keeps; the v1
    API's spans carry tags, the v3 API's attributes."""
    tags = span.get("tags") or []
    return _attr(span, "xsp.view.added") is True or any(
        t["key"] == "xsp.view.added" and t["value"] is True for t in tags
    )


def _check(jaeger: Jaeger, counts: dict[str, int]) -> None:
    for trace_id, expected in counts.items():
        spans = _read_back(jaeger, trace_id, expected, stored=True)
        stored = [s for s in spans if not _added(s)]
        assert len(stored) == expected, trace_id
        ids = {s["spanId"] for s in spans}
        roots = [s for s in spans if not s.get("parentSpanId")]
        assert len(roots) == 1 and _attr(roots[0], "xsp.level") == "model"
        levels = "MF" if expected > 1 else "M"
        # one name a level set, labelled as traced
        assert roots[0]["name"] == f"torchvision:resnet18 · {levels} (traced)"
        assert _attr(roots[0], "xsp.iteration") is not None  # the iteration: an attribute
        assert all(s["parentSpanId"] in ids for s in spans if s.get("parentSpanId"))
        if expected > 1:
            modules = [s for s in spans if _attr(s, "xsp.kind") == "module"]
            forward = [s for s in modules if _attr(s, "xsp.phase") == "forward"]
            assert len(forward) == 76 and {_attr(s, "xsp.level") for s in modules} == {"framework"}
            conv1 = next(s for s in forward if _attr(s, "xsp.module.path") == "conv1")
            assert _attr(conv1, "xsp.input.shapes") == "[[2,3,224,224]]"
            assert int(_attr(conv1, "xsp.module.params")) == 9408
            # each layer's backward under a span of its own, its nodes under it
            backward = {s["spanId"]: s for s in modules if _added(s)}
            assert "conv1 (backward)" in {s["name"] for s in backward.values()}
            moved = [s for s in spans if s.get("parentSpanId") in backward]
            assert {_attr(s, "xsp.kind") for s in moved} >= {"backward"}
        legacy = jaeger.get(f"/api/traces/{trace_id}")
        assert not legacy.get("errors")
        (trace,) = legacy["data"]
        assert len(trace["spans"]) == len(spans)
        warnings = [w for s in trace["spans"] for w in (s.get("warnings") or [])]
        assert warnings == []  # no clock-skew or orphan-span warnings
        # one service per level, as XSP gave each level its own tracer
        services = {p["serviceName"] for p in trace["processes"].values()}
        assert services == ({"xsp.model", "xsp.framework"} if expected > 1 else {"xsp.model"})


def test_push_straight_to_jaeger(jaeger: Jaeger, tmp_path: Path) -> None:
    counts = _measurement(tmp_path / "direct", "e2e-direct")
    _push(tmp_path / "direct", jaeger.otlp_http, "--traced")
    _check(jaeger, counts)


def test_a_pushed_trace_survives_a_restart_of_jaeger(tmp_path: Path) -> None:
    """deploy/jaeger.yaml keeps traces in Badger on disk: stopped and started again on the same
    directory (and other ports), Jaeger still returns every span of both pushed traces."""
    _need_jaeger()
    counts = _measurement(tmp_path / "kept", "e2e-restart")
    data = tmp_path / "badger"
    first = Jaeger(tmp_path, data)
    try:
        _push(tmp_path / "kept", first.otlp_http, "--traced")
        _check(first, counts)
    finally:
        first.stop()
    second = Jaeger(tmp_path, data)
    try:
        _check(second, counts)
        services = second.get("/api/services")["data"]
        assert set(services) == {"xsp.model", "xsp.framework"}
    finally:
        second.stop()


def test_push_through_the_collector_to_jaeger(jaeger: Jaeger, tmp_path: Path) -> None:
    counts = _measurement(tmp_path / "via", "e2e-collector")
    collector = http_collector(
        tmp_path / "collected", forward=f"grpc://{jaeger.otlp_grpc}", flush_interval_s=0.1
    )
    try:
        _push(tmp_path / "via", f"http://127.0.0.1:{collector.http_port}", "--traced")
    finally:
        collector.stop()
    assert collector.forward_errors == 0
    _check(jaeger, counts)
    stored = store.open_measurement(tmp_path / "collected" / "e2e-collector")
    assert sorted(r.levels for r in stored) == ["M", "MF"]


def _legacy(jaeger: Jaeger, trace_id: str) -> dict[str, Any]:
    """The trace as Jaeger's UI reads it (the v1 API, adjusters applied)."""
    legacy = jaeger.get(f"/api/traces/{trace_id}")
    assert not legacy.get("errors")
    (trace,) = legacy["data"]
    return trace


@pytest.fixture(scope="module")
def pushed(jaeger: Jaeger) -> Jaeger:
    """Jaeger holding the committed measurement's MFLG run and its replayed step (what ``xsp
    push`` sends for a measurement by default), the link it printed in ``pushed.link``."""
    _push(MEASUREMENT / "MFLG", jaeger.otlp_http)
    done = _push(MEASUREMENT, jaeger.otlp_http, "--ui", jaeger.query)
    jaeger.link = done.stdout
    return jaeger


def test_jaeger_shows_recorded_gpu_times_and_the_reconstruction_apart(pushed: Jaeger) -> None:
    """MFLG kernels start after their launch call has ended (async), which Jaeger's clock-skew
    adjuster would 'correct'. It must leave every time as recorded and warn about nothing, and
    the reconstruction, pushed into the same Jaeger, must be traces of its own."""
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.reconstruction.reconstruct import reconstruct

    jaeger = pushed
    measured = store.open_run(MEASUREMENT / "MFLG").spans()
    rebuilt, _ = reconstruct(MeasurementStore(MEASUREMENT))
    for table in (measured, rebuilt):
        rows = [r for r in table.to_pylist() if r["iteration"] in (0, 7)]
        for trace_id in {r["trace_id"].hex() for r in rows}:
            expected = {r["span_id"]: r for r in rows if r["trace_id"].hex() == trace_id}
            read = _read_back(jaeger, trace_id, len(expected), stored=True)
            assert len([s for s in read if not _added(s)]) == len(expected)
            # ResNet-50's layers' backward spans and the step's gradient accumulation span
            assert len(read) - len(expected) == 182 + 1
            trace = _legacy(jaeger, trace_id)
            stored = [s for s in trace["spans"] if not _added(s)]
            assert len(stored) == len(expected) > 5000
            assert [w for s in trace["spans"] for w in (s.get("warnings") or [])] == []
            for span in stored:  # microseconds in this API, truncated from nanoseconds
                row = expected[int(span["spanID"], 16)]
                assert span["startTime"] == row["start_ns"] // 1000
                assert span["duration"] == row["dur_ns"] // 1000
    assert set(measured.column("trace_id").to_pylist()).isdisjoint(
        rebuilt.column("trace_id").to_pylist()
    )


def test_the_trace_page_renders_the_stack_in_a_browser(pushed: Jaeger) -> None:
    """Jaeger's own UI (not the placeholder of the Go module build) draws the MFLG trace's span
    tree: the step, a layer, an aten op, a library call, an API call and a kernel, no warnings."""
    import html
    import re

    from tests.browser import dump_dom

    trace_id = store.open_run(MEASUREMENT / "MFLG").spans().column("trace_id")[0].as_py().hex()
    _read_back(pushed, trace_id, 5126)
    dom = dump_dom(f"{pushed.query}/trace/{trace_id}", size="1400,4000")
    assert "not the Jaeger UI" not in dom
    names = [html.unescape(n) for n in re.findall(r'class="endpoint-name">([^<]*)<', dom)]
    assert names[0] == "torchvision:resnet50 train b64 · MFLG (traced)"
    for wanted in ("conv1", "aten::conv2d", "cudnnBackendExecute", "cudaLaunchKernel"):
        assert wanted in names, wanted
    # kernels by their short names (the full one is an attribute), on the GPU's own service
    assert "bn_fw_tr_1C11_singleread" in names or "bn_fw_tr_1C11_kernel_NCHW" in names
    assert not any(n.startswith("void ") for n in names)
    for service in ("xsp.model", "xsp.framework", "xsp.library", "xsp.gpu"):
        assert service in dom, service
    assert "clock skew" not in dom.lower() and "duplicate span" not in dom.lower()


def test_a_step_of_100k_spans_is_folded_into_a_trace_jaeger_loads(
    jaeger: Jaeger, tmp_path: Path
) -> None:
    """The ResNet-50 iteration tiled to 102,501 spans in one step (as a 1B-parameter model's
    MFLG iteration has over 100k) reaches Jaeger folded within the default budget: every span
    the fold keeps and every summary reads back, and the UI's API warns about nothing."""
    import html
    import re

    import pyarrow as pa
    import pyarrow.compute as pc

    from benchmarks.large_trace import first_iteration, tiled_iteration
    from xsp.tracer.export.view import DEFAULT_MAX_SPANS_PER_TRACE, for_viewer

    resource, iteration = first_iteration()
    table = tiled_iteration(iteration, 20)
    trace_id = bytes.fromhex("7f" * 16)  # apart from the committed run's traces
    table = table.set_column(
        table.schema.get_field_index("trace_id"),
        "trace_id",
        pa.array([trace_id] * table.num_rows, pa.binary(16)),
    )
    write_run(tmp_path, "MFLG", table, resource)
    laid_out = for_viewer(table)
    expected = laid_out.num_rows
    summaries = expected - laid_out.column("view_folded_spans").null_count
    kept = expected - int(pc.sum(pc.fill_null(laid_out.column("view_added"), False)).as_py())
    assert table.num_rows == 102_501 and expected <= DEFAULT_MAX_SPANS_PER_TRACE
    done = subprocess.run(
        [sys.executable, "-m", "xsp", "push", str(tmp_path / "MFLG"), "--endpoint",
         jaeger.otlp_http],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"; {table.num_rows - kept} spans folded into {summaries} summaries" in done.stderr
    spans = _read_back(jaeger, trace_id.hex(), expected)
    assert len(spans) == expected
    trace = _legacy(jaeger, trace_id.hex())
    assert len(trace["spans"]) == expected
    assert [w for s in trace["spans"] for w in (s.get("warnings") or [])] == []
    folded = [s for s in spans if _attr(s, "xsp.view.folded.kernels") is not None]
    assert sum(int(_attr(s, "xsp.view.folded.kernels")) for s in folded) == 20 * 737
    from tests.browser import dump_dom  # the UI draws it: the step first, the summaries in it

    dom = dump_dom(f"{jaeger.query}/trace/{trace_id.hex()}", size="1400,4000")
    names = [html.unescape(n) for n in re.findall(r'class="endpoint-name">([^<]*)<', dom)]
    assert names[0] == "torchvision:resnet50 train b64 · MFLG (traced)"
    assert any(n.startswith("folded: ") for n in names)


def test_the_printed_link_finds_the_replayed_traces_within_its_budget(pushed: Jaeger) -> None:
    """The link ``xsp push`` printed asks Jaeger's search for the replayed step's root operation
    on the model service: what the UI's API returns for it is replayed traces only (not the
    MFLG run's, pushed into the same Jaeger over the same time range), ``limit`` of them, within
    the span budget that keeps the page fast (``benchmarks/jaeger_link.py`` times it)."""
    import re
    import urllib.parse

    from xsp.cli.jaeger_link import SEARCH_SPAN_BUDGET

    (link,) = re.findall(r"open in Jaeger: (\S+)", pushed.link)
    url = urllib.parse.urlsplit(link)
    assert f"{url.scheme}://{url.netloc}" == pushed.query and url.path == "/search"
    query = dict(urllib.parse.parse_qsl(url.query))
    assert query["service"] == "xsp.model"
    assert query["operation"] == "torchvision:resnet50 train b64 · reconstructed"
    assert int(query["limit"]) == SEARCH_SPAN_BUDGET // 5_126 == 1
    found = pushed.get(f"/api/traces?{url.query}")["data"]
    assert len(found) == 1
    for trace in found:
        roots = [s for s in trace["spans"] if not s["references"]]
        assert [r["operationName"] for r in roots] == [query["operation"]]
        assert len(trace["spans"]) == 5_126 + 182 + 1  # the replayed step, laid out
    assert sum(len(t["spans"]) for t in found) <= SEARCH_SPAN_BUDGET


def _paths(trace: dict[str, Any]) -> Counter[tuple[str, ...]]:
    """Each span's path from the root, as (service: operation) names: what Jaeger's trace
    compare lines two traces up by."""
    services = {key: p["serviceName"] for key, p in trace["processes"].items()}
    spans = {s["spanID"]: s for s in trace["spans"]}

    def path(span: dict[str, Any]) -> tuple[str, ...]:
        names: list[str] = []
        while span is not None:
            names.append(f"{services[span['processID']]}: {span['operationName']}")
            parent = next(
                (r["spanID"] for r in span["references"] if r["refType"] == "CHILD_OF"), None
            )
            span = spans.get(parent) if parent else None
        return tuple(reversed(names))

    return Counter(path(s) for s in trace["spans"])


def test_trace_compare_lines_up_iterations_and_measurements(pushed: Jaeger) -> None:
    """Jaeger's trace compare matches spans by their path of service and operation names. Two
    replayed iterations of one measurement have the same paths, every one (so the compare
    shows their durations apart, not two unrelated trees); so do the replays of two
    measurements of ResNet-50 b64 training (the H100 one and the H200 one), but for the 139
    library calls an iteration that the older capture recorded and the newer one does not."""
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.reconstruction.reconstruct import reconstruct

    other = ROOT / "benchmarks/data/replay-h200/r50-b64-train"
    _push(other, pushed.otlp_http)
    ids = {}
    for name, path in (("h100", MEASUREMENT), ("h200", other)):
        rebuilt, _ = reconstruct(MeasurementStore(path))
        for iteration in (3, 7):
            row = rebuilt.filter(
                pc.and_(pc.equal(rebuilt.column("iteration"), iteration),
                        pc.equal(rebuilt.column("kind"), "step"))
            )  # fmt: skip
            trace_id = row.column("trace_id")[0].as_py().hex()
            _read_back(pushed, trace_id, 5_000)
            ids[(name, iteration)] = trace_id
    paths = {key: _paths(_legacy(pushed, trace_id)) for key, trace_id in ids.items()}
    assert paths[("h100", 3)] == paths[("h100", 7)]
    assert paths[("h200", 3)] == paths[("h200", 7)]
    assert sum(paths[("h200", 3)].values()) == 4_987 + 182 + 1
    extra = paths[("h100", 3)] - paths[("h200", 3)]
    assert paths[("h200", 3)] - paths[("h100", 3)] == Counter()
    assert sum(extra.values()) == 139
    assert {path[-1].split(":")[0] for path in extra} == {"xsp.library"}
