"""Every OTLP field, through the collector and back (issue 29, items 1 and 2).

1. What the store worker's parser would refuse is refused at the door, naming the field: a
   string that is not UTF-8 in a resource attribute or an event name, a value nested past
   protobuf's 100 levels in a resource attribute (HTTP 400, gRPC INVALID_ARGUMENT), where the
   collector used to acknowledge it and quarantine it at flush time.
2. The OpenTelemetry SDK's own exporters (HTTP and gRPC) send into ``xsp collector serve``;
   ``xsp export`` and ``xsp push`` give back every field they sent (kind, status, events with
   the exception event, links, scope, typed attributes, arrays, xsp's keys with the SDK's types)
   under each sender's own resource (its schema URL, an empty string attribute), compared field
   by field with the SDK's own encoding of the same spans.
3. What raw OTLP allows beyond what the SDK sends comes back too: a resource's dropped count and
   the schema URLs, a status message on OK and UNSET, empty-valued resource attributes, and a
   foreign sender's value of another type under one of xsp's attribute keys (its type and value,
   not the column's conversion of it).
"""

from __future__ import annotations

import contextlib
import http.server
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow.compute as pc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tests.fixtures import free_ports, make_collector, start_collector
from tests.test_collector import _post
from xsp.core import otlp
from xsp.core.store import open_measurement, open_run, read_json

ROOT = Path(__file__).resolve().parents[1]
RESOURCE_SCHEMA = "https://opentelemetry.io/schemas/1.24.0"
Request = trace_service_pb2.ExportTraceServiceRequest
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


# -- 1. refused at the door, not quarantined after -----------------------------------------------
def _request(host: str = "HOSTNAME", event: str = "EVENTNAME") -> Request:
    request = Request()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.add(key="service.name").value.string_value = "door"
    resource_spans.resource.attributes.add(key="host.name").value.string_value = host
    span = resource_spans.scope_spans.add().spans.add(
        trace_id=b"\1" * 16,
        span_id=b"\2" * 8,
        name="GET",
        start_time_unix_nano=1,
        end_time_unix_nano=5,
    )
    span.events.add(name=event, time_unix_nano=3)
    span.status.SetInParent()  # UNSET, as the encoders write it (absent is the same value)
    return request


def _nested(depth: int) -> AnyValue:
    value = AnyValue(int_value=1)
    for _ in range(depth):
        nested = AnyValue()
        nested.array_value.values.add().CopyFrom(value)
        value = nested
    return value


def _bad_body(case: str) -> tuple[bytes, str]:
    """A request the store worker's parser refuses, and the field the refusal must name."""
    good = _request().SerializeToString()
    if case == "resource attribute not UTF-8":
        return (
            good.replace(b"HOSTNAME", b"\xff" * 8),
            "resource_spans[0].resource.attributes['host.name'].value.string_value is not UTF-8",
        )
    if case == "event name not UTF-8":
        return (
            good.replace(b"EVENTNAME", b"\xfe" * 9),
            "resource_spans[0].scope_spans[0].spans[0].events[0].name is not UTF-8",
        )
    deep = _request()
    deep.resource_spans[0].resource.attributes.add(key="deep").value.CopyFrom(_nested(150))
    return (
        deep.SerializeToString(),
        "resource_spans[0].resource.attributes['deep'].value is nested more than 100",
    )


@pytest.mark.parametrize(
    "case",
    ["resource attribute not UTF-8", "event name not UTF-8", "resource attribute 150 deep"],
)
def test_what_the_store_would_refuse_is_refused_at_the_door(tmp_path: Path, case: str) -> None:
    body, named = _bad_body(case)
    c = make_collector(tmp_path).start()
    try:
        code, reply, _ = _post(c.http_port, body)
        assert code == 400 and named in reply.decode(errors="replace"), reply[:200]
        with grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}") as channel:
            export = channel.unary_unary(
                EXPORT, request_serializer=None, response_deserializer=None
            )
            with pytest.raises(grpc.RpcError) as refused:
                export(body, timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert named in refused.value.details()
        assert _post(c.http_port, _request().SerializeToString())[0] == 200
    finally:
        c.stop()
    assert c.quarantined_requests == 0 and not (tmp_path / "store" / ".quarantine").exists()
    (run,) = open_measurement(tmp_path / "store" / "door" / "otlp", foreign=True)
    assert run.spans().num_rows == 1  # the one good request, acknowledged and stored


# -- 2. the SDK's exporters in, export and push out -----------------------------------------------
def _sdk_spans(exporter: Any, host: str) -> Request:
    """Spans of every kind of field, sent by the SDK through ``exporter``; returns the SDK's
    own encoding of them (what its exporters put on the wire)."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk import trace as sdk_trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = sdk_trace.TracerProvider(
        resource=Resource.create(
            {"service.name": "shop", "host.name": host, "pod.index": 3, "deployment.zone": ""},
            schema_url=RESOURCE_SCHEMA,
        )
    )
    kept = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(kept))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer(
        "shop.checkout",
        "1.2.3",
        schema_url="https://opentelemetry.io/schemas/1.21.0",
        attributes={"scope.attr": "s"},
    )
    other = tracer.start_span("earlier job")
    other.end()
    attributes = {
        "http.method": "GET",
        "http.status_code": 200,
        "ratio": 0.25,
        "cached": True,
        "tags": ["a", "b"],
        "sizes": [1, 2, 3],
        "weights": [0.5, 1.5],
        "bits": [True, False],
        "xsp.iteration": "7",  # xsp's keys with another sender's types: given back as sent
        "xsp.module.type": 5,
    }
    with tracer.start_as_current_span("GET /cart", kind=trace.SpanKind.SERVER) as root:
        root.set_attributes(attributes)
        root.add_event("cache miss", {"key": "cart:7", "attempt": 2})
        link = trace.Link(other.get_span_context(), {"link.kind": "follows"})
        with tracer.start_as_current_span("db", kind=trace.SpanKind.CLIENT, links=[link]) as db:
            db.set_status(trace.Status(trace.StatusCode.OK))
        with (
            pytest.raises(ValueError),
            tracer.start_as_current_span("charge", kind=trace.SpanKind.PRODUCER),
        ):
            raise ValueError("card declined")  # the exception event, status ERROR
    provider.force_flush()
    provider.shutdown()
    return encode_spans(kept.get_finished_spans())


def _nested_request() -> Request:
    """What the SDK cannot send: nested values, bytes, empty arrays, several links, dropped
    counts, a trace state, an empty-message error, a scope without version."""
    request = Request()
    resource_spans = request.resource_spans.add()
    for key, text in (("service.name", "shop"), ("host.name", "c")):
        resource_spans.resource.attributes.add(key=key).value.string_value = text
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = "raw"
    span = scope_spans.spans.add(
        trace_id=b"\7" * 16,
        span_id=b"\0\0\0\0\0\0\0\x09",
        trace_state="vendor=1",
        flags=0x301,
        name="nested",
        kind=Span.SPAN_KIND_CONSUMER,
        start_time_unix_nano=10,
        end_time_unix_nano=10,
        dropped_attributes_count=2,
        dropped_events_count=1,
        dropped_links_count=4,
        status=Status(code=Status.STATUS_CODE_ERROR),
    )
    value = span.attributes.add(key="doc").value
    inner = value.kvlist_value.values.add(key="list").value.array_value
    inner.values.add().kvlist_value.values.add(key="b").value.bytes_value = b"\0\xff"
    inner.values.add().double_value = float("inf")
    inner.values.add().int_value = -(2**63)
    value.kvlist_value.values.add(key="empty").value.array_value.SetInParent()
    span.attributes.add(key="unset")
    span.events.add(name="e", time_unix_nano=10, dropped_attributes_count=5)
    for index in (1, 2):
        link = span.links.add(trace_id=bytes([index]) * 16, span_id=bytes([index]) * 8)
        if index == 2:
            link.attributes.add(key="n").value.int_value = 2
    return request


def _by_span(requests: list[Request]) -> dict[tuple[bytes, bytes], tuple[Any, ...]]:
    """Each span with the resource (attributes as sent, an empty value's presence included;
    its dropped count and schema URL) and scope it came under."""
    out = {}
    for request in requests:
        for resource_spans in request.resource_spans:
            resource = (
                [kv.SerializeToString() for kv in resource_spans.resource.attributes],
                resource_spans.resource.dropped_attributes_count,
                resource_spans.schema_url,
            )
            for scope_spans in resource_spans.scope_spans:
                scope = (
                    scope_spans.scope.SerializeToString(deterministic=True),
                    scope_spans.schema_url,
                )
                for span in scope_spans.spans:
                    out[(span.trace_id, span.span_id)] = (resource, scope, span)
    return out


def _assert_same(got: list[Request], sent: list[Request]) -> None:
    expected, back = _by_span(sent), _by_span(got)
    assert back.keys() == expected.keys()
    for key, (resource, scope, span) in expected.items():
        got_resource, got_scope, got_span = back[key]
        assert got_span == span, span.name  # every field, in order
        assert got_scope == scope, span.name
        assert got_resource == resource, span.name


class _Capture(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self) -> None:
        self.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # Jaeger's query API, as far as `xsp push` asks it
        body = b'{"data": []}' if self.path.startswith("/api/services") else b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _capturing() -> Iterator[tuple[int, list[bytes]]]:
    """An OTLP/HTTP endpoint on loopback that keeps the bodies it is sent."""
    bodies: list[bytes] = []
    handler = type("Handler", (_Capture,), {"bodies": bodies})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], bodies
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def capture() -> Iterator[tuple[int, list[bytes]]]:
    with _capturing() as endpoint:
        yield endpoint


def _xsp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xsp", *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_sdk_exporters_round_trip_through_the_store(
    tmp_path: Path, capture: tuple[int, list[bytes]]
) -> None:
    # the SDK's own exporters (the dev extra's opentelemetry-exporter-otlp)
    grpc_exporter = pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
    http_exporter = pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    store = tmp_path / "store"
    http_port, grpc_port = free_ports(2)
    proc = start_collector(store, http_port, grpc_port)
    try:
        over_http = _sdk_spans(
            http_exporter.OTLPSpanExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/traces"), "a"
        )
        over_grpc = _sdk_spans(
            grpc_exporter.OTLPSpanExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True), "b"
        )
        nested = _nested_request()
        assert _post(http_port, nested.SerializeToString())[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)  # flushes the spool into the store
        assert proc.wait(timeout=60) == 0
    sent = [over_http, over_grpc, nested]
    assert (
        sum(1 for r in sent for rs in r.resource_spans for ss in rs.scope_spans for _ in ss.spans)
        == 9
    )

    run_dir = store / "shop" / "otlp"
    resources = open_run(run_dir, foreign=True).resources
    assert resources is not None and "resources" not in read_json(run_dir / "run.json")
    hosts = sorted(
        kv["value"]["stringValue"]
        for entry in resources.values()
        for kv in entry["attributes"]
        if kv["key"] == "host.name"
    )
    assert hosts == ["a", "b", "c"]  # three senders, one directory, three resources

    exported = _xsp("export", str(run_dir), "-o", str(tmp_path / "out.jsonl"))
    assert exported.returncode == 0, exported.stderr
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    _assert_same([otlp.parse_json(line.encode()) for line in lines], sent)

    port, bodies = capture
    endpoint, ui = f"http://127.0.0.1:{port}/v1/traces", f"http://127.0.0.1:{port}"
    pushed = _xsp("push", str(run_dir), "--endpoint", endpoint, "--ui", ui)
    assert pushed.returncode == 0, pushed.stderr
    assert "search?service=shop&" in pushed.stdout  # the senders' own service, no xsp level
    _assert_same([Request.FromString(body) for body in bodies], sent)


def test_a_foreign_run_stays_out_of_the_analyses(tmp_path: Path) -> None:
    c = make_collector(tmp_path).start()
    try:
        assert _post(c.http_port, _request().SerializeToString())[0] == 200
    finally:
        c.stop()
    summary = _xsp("summary", str(tmp_path / "store" / "door" / "otlp"))
    assert summary.returncode != 0
    assert "`xsp export` and `xsp push` give them back" in summary.stderr
    exported = _xsp("export", str(tmp_path / "store" / "door" / "otlp"))  # one sender, stdout
    assert exported.returncode == 0, exported.stderr
    (line,) = exported.stdout.splitlines()
    _assert_same([otlp.parse_json(line.encode())], [_request()])


def test_the_door_parses_every_field_the_store_worker_parses() -> None:
    """The door's mirror declares every field of OTLP's messages (only span attributes differ:
    a map, wire-compatible), so no field is skipped unchecked, today or in a later OTLP."""
    from opentelemetry.proto.trace.v1 import trace_pb2

    from xsp.collector import ingest_view

    view = ingest_view._Request.DESCRIPTOR
    real = Request.DESCRIPTOR
    for path in ("resource_spans", "scope_spans", "spans"):
        view = view.fields_by_name[path].message_type
        real = real.fields_by_name[path].message_type
        assert real.full_name in (
            "opentelemetry.proto.trace.v1." + n for n in ("ResourceSpans", "ScopeSpans", "Span")
        )
        mirrored = {f.number: (f.name, f.type) for f in view.fields}
        assert mirrored == {f.number: (f.name, f.type) for f in real.fields}
        for field_ in real.fields:
            if field_.message_type is not None and field_.name not in (
                "scope_spans",
                "spans",
                "attributes",
            ):
                assert view.fields_by_number[field_.number].message_type is field_.message_type
    assert trace_pb2.Span.DESCRIPTOR is real


# -- 3. what raw OTLP allows beyond the SDK --------------------------------------------------------
XSP_KEYS_RETYPED = {  # xsp's attribute keys with a value of another type than their column's
    "xsp.iteration": AnyValue(string_value="7"),  # an int32 column: stored as 7
    "xsp.rank": AnyValue(double_value=2.0),  # an int32 column: stored as 2
    "xsp.module.type": AnyValue(int_value=5),  # a string column: stored as "5"
    "xsp.op.name": AnyValue(bool_value=True),  # a string column: stored as "True"
    "xsp.gpu.utilization_pct": AnyValue(int_value=87),  # a double column: stored as 87.0
    "xsp.module.params": AnyValue(),  # an int64 column, an empty value: stored as null
}


def _raw_request() -> Request:
    """Raw OTLP the SDK cannot send: a resource's dropped count, schema URLs on the resource and
    the scope, empty-valued attributes on the resource and the scope, a status message on OK
    and on UNSET, and xsp's attribute keys with other types than xsp's columns hold."""
    request = Request()
    resource_spans = request.resource_spans.add(schema_url="https://example.com/resource/1")
    resource = resource_spans.resource
    resource.dropped_attributes_count = 3
    resource.attributes.add(key="service.name").value.string_value = "edge"
    resource.attributes.add(key="empty.string").value.string_value = ""
    resource.attributes.add(key="empty.value").value.SetInParent()
    resource.attributes.add(key="zero").value.int_value = 0
    scope_spans = resource_spans.scope_spans.add(schema_url="https://example.com/scope/2")
    scope_spans.scope.name = "raw"
    scope_spans.scope.dropped_attributes_count = 1
    scope_spans.scope.attributes.add(key="scope.empty").value.SetInParent()
    statuses = {
        b"\1": Status(code=Status.STATUS_CODE_OK, message="served from cache"),
        b"\2": Status(code=Status.STATUS_CODE_UNSET, message="no verdict"),
        b"\3": Status(code=Status.STATUS_CODE_ERROR),  # an error with an empty message
        b"\4": Status(code=Status.STATUS_CODE_ERROR, message="timeout"),
    }
    for byte, status in statuses.items():
        scope_spans.spans.add(
            trace_id=b"\5" * 16,
            span_id=byte * 8,
            name=f"status {status.code}",
            start_time_unix_nano=100,
            end_time_unix_nano=200,
            status=status,
        )
    span = scope_spans.spans.add(
        trace_id=b"\5" * 16,
        span_id=b"\6" * 8,
        name="retyped",
        kind=Span.SPAN_KIND_SERVER,
        start_time_unix_nano=100,
        end_time_unix_nano=300,
    )
    span.status.SetInParent()
    for key, value in XSP_KEYS_RETYPED.items():
        span.attributes.add(key=key).value.CopyFrom(value)
    span.attributes.add(key="http.route").value.string_value = "/predict"
    return request


@pytest.fixture(scope="module")
def raw_round_trip(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The raw request through a collector, and what ``xsp export`` and ``xsp push`` gave back
    of it (each parsed as OTLP), with the stored spans."""
    tmp = tmp_path_factory.mktemp("raw")
    c = make_collector(tmp).start()
    try:
        assert _post(c.http_port, _raw_request().SerializeToString())[0] == 200
    finally:
        c.stop()
    run_dir = tmp / "store" / "edge" / "otlp"
    exported = _xsp("export", str(run_dir), "-o", str(tmp / "out.jsonl"))
    assert exported.returncode == 0, exported.stderr
    lines = (tmp / "out.jsonl").read_text().splitlines()
    with _capturing() as (port, bodies):
        pushed = _xsp("push", str(run_dir), "--endpoint", f"http://127.0.0.1:{port}/v1/traces")
        assert pushed.returncode == 0, pushed.stderr
    (run,) = open_measurement(run_dir, foreign=True)
    return {
        "export": [otlp.parse_json(line.encode()) for line in lines],
        "push": [Request.FromString(body) for body in bodies],
        "stored": run.spans(),
    }


WAYS_BACK = ("export", "push")


@pytest.mark.parametrize("way", WAYS_BACK)
def test_a_resources_dropped_count_and_schema_urls_come_back(
    raw_round_trip: dict[str, Any], way: str
) -> None:
    (request,) = raw_round_trip[way]
    (resource_spans,) = request.resource_spans
    assert resource_spans.resource.dropped_attributes_count == 3
    assert resource_spans.schema_url == "https://example.com/resource/1"
    (scope_spans,) = resource_spans.scope_spans
    assert scope_spans.schema_url == "https://example.com/scope/2"
    assert scope_spans.scope == _raw_request().resource_spans[0].scope_spans[0].scope


@pytest.mark.parametrize("way", WAYS_BACK)
def test_a_status_message_comes_back_whatever_its_code(
    raw_round_trip: dict[str, Any], way: str
) -> None:
    (request,) = raw_round_trip[way]
    back = {
        span.span_id[:1]: (span.status.code, span.status.message)
        for span in request.resource_spans[0].scope_spans[0].spans
    }
    assert back == {
        b"\1": (Status.STATUS_CODE_OK, "served from cache"),
        b"\2": (Status.STATUS_CODE_UNSET, "no verdict"),
        b"\3": (Status.STATUS_CODE_ERROR, ""),
        b"\4": (Status.STATUS_CODE_ERROR, "timeout"),
        b"\6": (Status.STATUS_CODE_UNSET, ""),
    }
    # an error's message stays where the analyses read failures; another's is not one
    stored = raw_round_trip["stored"].sort_by("span_id")
    assert stored.column("status_message").to_pylist() == [None, None, "", "timeout", None]


@pytest.mark.parametrize("way", WAYS_BACK)
def test_empty_valued_resource_attributes_come_back(
    raw_round_trip: dict[str, Any], way: str
) -> None:
    (request,) = raw_round_trip[way]
    sent = _raw_request().resource_spans[0].resource.attributes
    got = request.resource_spans[0].resource.attributes
    assert [kv.SerializeToString() for kv in got] == [kv.SerializeToString() for kv in sent]
    empty = next(kv for kv in got if kv.key == "empty.value")
    assert empty.HasField("value") and empty.value.WhichOneof("value") is None


@pytest.mark.parametrize("way", WAYS_BACK)
def test_xsp_keys_with_another_senders_types_come_back_as_sent(
    raw_round_trip: dict[str, Any], way: str
) -> None:
    (request,) = raw_round_trip[way]
    (span,) = (s for s in request.resource_spans[0].scope_spans[0].spans if s.name == "retyped")
    assert {kv.key: kv.value for kv in span.attributes} == {
        **XSP_KEYS_RETYPED,
        "http.route": AnyValue(string_value="/predict"),
    }
    # xsp's columns still hold them converted, as the analyses read them
    (row,) = raw_round_trip["stored"].filter(pc.equal(pc.field("name"), "retyped")).to_pylist()
    assert (row["iteration"], row["rank"], row["module_type"], row["op_name"]) == (
        7,
        2,
        "5",
        "True",
    )
    assert (row["gpu_utilization_pct"], row["module_params"]) == (87.0, None)


def test_the_raw_request_comes_back_whole(raw_round_trip: dict[str, Any]) -> None:
    for way in WAYS_BACK:
        _assert_same(raw_round_trip[way], [_raw_request()])
