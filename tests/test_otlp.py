"""OTLP encoding (protobuf and JSON) and the HTTP/gRPC transports against local receivers."""

from __future__ import annotations

import base64
import inspect
import io
import json
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import grpc
import pyarrow as pa
import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.fixtures import load_raw
from xsp.core import otlp
from xsp.core.errors import ConfigError, ExportError
from xsp.core.otlp.transport import GrpcTransport, HttpTransport, OtlpConfig, make_transport
from xsp.tracer.convert.spans import build_table
from xsp.tracer.export import otlp_layout
from xsp.tracer.export.sinks import OtlpJsonFileSink, OtlpSink, SpanBatch

RESOURCE = {
    "service.name": "xsp",
    "host.name": "test-host",
    "xsp.levels": "MF",
    "xsp.workload": "torchvision:resnet18",
    "xsp.mode": "train",
    "xsp.batch_size": 2,
    "process.pid": 42,
}


@pytest.fixture(scope="module")
def table() -> pa.Table:
    steps, framework, _ = load_raw("resnet18_train_cpu")
    return build_table("run-otlp", "MF", {"M": steps, "F": framework})[0]


def test_protobuf_request_carries_every_span_with_attributes(table: pa.Table) -> None:
    request = otlp_layout.encode_request(RESOURCE, table)
    spans = request.resource_spans[0].scope_spans[0].spans
    assert len(spans) == table.num_rows
    root = spans[0]
    # Jaeger lists traces by their root's name: workload, level set and iteration tell them apart
    assert root.parent_span_id == b""
    assert root.name == "torchvision:resnet18 train b2 · MF (traced)"
    attrs = {kv.key: kv.value for kv in root.attributes}
    assert attrs["xsp.level"].string_value == "model" and attrs["xsp.iteration"].int_value == 0
    conv = next(s for s in spans if s.name == "conv1")
    conv_attrs = {kv.key: kv.value for kv in conv.attributes}
    assert conv_attrs["xsp.module.path"].string_value == "conv1"
    assert conv_attrs["xsp.module.params"].int_value == 9408
    assert conv.end_time_unix_nano > conv.start_time_unix_nano
    res = {kv.key: kv.value for kv in request.resource_spans[0].resource.attributes}
    assert res["host.name"].string_value == "test-host" and res["process.pid"].int_value == 42
    # Jaeger's v1 API keys hosts by "ip" alone: without it every child counts as another host
    assert res["ip"].string_value == "test-host"


def test_json_form_follows_the_otlp_json_rules(table: pa.Table) -> None:
    data = otlp.request_to_json(otlp_layout.encode_request(RESOURCE, table.slice(0, 5)))
    spans = data["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert len(spans[0]["traceId"]) == 32 and len(spans[0]["spanId"]) == 16
    assert int(spans[0]["traceId"], 16) and "parentSpanId" not in spans[0]
    assert spans[1]["parentSpanId"] == spans[0]["spanId"]
    assert spans[0]["kind"] == 1 and isinstance(spans[0]["startTimeUnixNano"], str)
    # Decoding it back (hex ids -> bytes) yields the same request.
    for span in spans:
        for key in ("traceId", "spanId", "parentSpanId"):
            if key in span:
                span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    again = ParseDict(data, trace_service_pb2.ExportTraceServiceRequest())
    assert again == otlp_layout.encode_request(RESOURCE, table.slice(0, 5))


def test_json_built_from_the_columns_equals_protobufs_own_rendering(table: pa.Table) -> None:
    """encode_request_json (the file export's) writes what MessageToDict writes of the
    protobuf request, edge cases included: an error with and without a message, an empty name,
    a zero start, NaN and infinite doubles, a bool, no resource attributes."""
    rows = table.slice(0, 40).to_pylist()
    rows[3]["status_message"], rows[4]["status_message"] = "RuntimeError: boom", ""
    rows[5]["name"], rows[6]["start_ns"], rows[6]["dur_ns"] = "", 0, 0
    rows[7]["gpu_power_w"], rows[8]["gpu_power_w"] = float("nan"), float("-inf")
    rows[9]["gpu_power_w"] = 0.0
    edited = pa.Table.from_pylist(rows, schema=table.schema)
    for resource in ({**RESOURCE, "xsp.flag": False, "xsp.ratio": 1.5}, {}):
        for part, version in ((edited, "1.2.3"), (table, ""), (table.slice(0, 0), "")):
            built = otlp_layout.encode_request_json(resource, part, version)
            rendered = otlp.request_to_json(otlp_layout.encode_request(resource, part, version))
            assert json.dumps(built) == json.dumps(rendered)


def test_file_sink_writes_one_trace_per_line(table: pa.Table) -> None:
    two = pa.concat_tables([table, build_table_shifted(table)])
    handle = io.StringIO()
    sink = OtlpJsonFileSink(handle)
    sink.export(SpanBatch.of(RESOURCE, two))
    lines = handle.getvalue().splitlines()
    assert sink.lines == 2 and len(lines) == 2
    ids = {
        json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"]
        for line in lines
    }
    assert len(ids) == 2


def build_table_shifted(table: pa.Table) -> pa.Table:
    other = pa.array([b"\x01" * 16] * table.num_rows, pa.binary(16))
    return table.set_column(table.schema.get_field_index("trace_id"), "trace_id", other)


def test_batches_keep_traces_whole_under_the_limit(table: pa.Table) -> None:
    two = pa.concat_tables([table, build_table_shifted(table)])
    sizes = [b.num_rows for b in otlp.batches_under(two, table.num_rows + 10)]
    assert sizes == [table.num_rows, table.num_rows]
    pieces = list(otlp.batches_under(table, 500))
    assert (
        sum(p.num_rows for p in pieces) == table.num_rows and max(p.num_rows for p in pieces) <= 500
    )


class _Receiver(BaseHTTPRequestHandler):
    answers: list[int] = []
    received: list[tuple[str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        code = self.answers.pop(0) if self.answers else 200
        if code == 200:
            self.received.append((self.headers["Content-Type"], body))
        self.send_response(code)
        if code == 503:
            self.send_header("Retry-After", "0")
        self.end_headers()
        self.wfile.write(b"bad payload" if code == 400 else b"")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_endpoint():  # type: ignore[no-untyped-def]
    _Receiver.answers, _Receiver.received = [], []
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_http_protobuf_export_with_retry(http_endpoint: str, table: pa.Table) -> None:
    _Receiver.answers = [503]
    config = OtlpConfig.from_env(http_endpoint, env={})
    assert config is not None and config.endpoint.endswith("/v1/traces")
    sink = OtlpSink(
        HttpTransport(config, sleep=lambda s: None), max_spans_per_request=1000, view=False
    )
    sink.export(SpanBatch.of(RESOURCE, table))
    sent = 0
    for content_type, body in _Receiver.received:
        assert content_type == "application/x-protobuf"
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        sent += len(request.resource_spans[0].scope_spans[0].spans)
    assert sent == table.num_rows == sink.spans_sent
    assert len(_Receiver.received) == 2  # 1791 spans, at most 1000 a request


def test_http_json_export_and_a_rejection(http_endpoint: str, table: pa.Table) -> None:
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_ENDPOINT": http_endpoint}
    config = OtlpConfig.from_env(env=env)
    assert config is not None and config.protocol == "http/json"
    transport = make_transport(config)
    transport.send(otlp_layout.encode_request(RESOURCE, table.slice(0, 3)))
    content_type, body = _Receiver.received[0]
    assert content_type == "application/json"
    assert len(json.loads(body)["resourceSpans"][0]["scopeSpans"][0]["spans"]) == 3
    _Receiver.answers = [400]
    with pytest.raises(ExportError, match="HTTP 400: bad payload"):
        transport.send(otlp_layout.encode_request(RESOURCE, table.slice(0, 3)))


def test_unreachable_endpoint_is_an_export_error(table: pa.Table) -> None:
    config = OtlpConfig.from_env("http://127.0.0.1:9", env={})
    assert config is not None
    with pytest.raises(ExportError, match="unreachable"):
        HttpTransport(config, sleep=lambda s: None).send(
            otlp_layout.encode_request(RESOURCE, table.slice(0, 1))
        )


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.metadata: list[Any] = []

    def Export(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        return trace_service_pb2.ExportTraceServiceResponse()


def test_grpc_export_with_headers(table: pa.Table) -> None:
    service = _TraceService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        env = {
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_HEADERS": "x-team=perf%20lab",
        }
        config = OtlpConfig.from_env(f"http://127.0.0.1:{port}", env=env)
        assert config is not None
        transport = GrpcTransport(config)
        OtlpSink(transport, view=False).export(SpanBatch.of(RESOURCE, table))
        transport.close()
    finally:
        server.stop(None)
    assert (
        sum(len(r.resource_spans[0].scope_spans[0].spans) for r in service.requests)
        == table.num_rows
    )
    assert service.metadata[0]["x-team"] == "perf lab"


def test_configuration_from_the_standard_variables() -> None:
    assert OtlpConfig.from_env(env={}) is None
    grpc_default = OtlpConfig.from_env("localhost:4317", env={})
    assert grpc_default is not None and grpc_default.protocol == "grpc"
    signal = OtlpConfig.from_env(
        env={
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:4318/custom",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        }
    )
    assert (
        signal is not None and signal.endpoint == "http://h:4318/custom" and signal.timeout_s == 2.5
    )
    with pytest.raises(ConfigError, match="'thrift'"):
        OtlpConfig.from_env("http://h:4318", env={"OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"})
    with pytest.raises(ConfigError, match="key=value"):
        OtlpConfig.from_env("http://h:4318", env={"OTEL_EXPORTER_OTLP_HEADERS": "novalue"})


def test_a_link_with_ids_of_the_wrong_size_is_refused_at_the_door() -> None:
    """Both the full parser and the collector's ingest view refuse it before acknowledgement
    (a 3-byte link span id would otherwise fail at flush time, after the 200)."""
    from opentelemetry.proto.trace.v1 import trace_pb2

    from xsp.collector import ingest_view

    span = trace_pb2.Span(
        trace_id=b"\x01" * 16,
        span_id=b"\x02" * 8,
        name="step",
        start_time_unix_nano=1,
        end_time_unix_nano=2,
        links=[trace_pb2.Span.Link(trace_id=b"\x03" * 16, span_id=b"\x04" * 3)],
    )
    request = trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[trace_pb2.ResourceSpans(scope_spans=[trace_pb2.ScopeSpans(spans=[span])])]
    )
    with pytest.raises(otlp.DecodeError, match="link's trace_id must be 16 bytes"):
        otlp.validate_span(span)
    with pytest.raises(otlp.DecodeError, match="link's trace_id must be 16 bytes"):
        ingest_view.check(request.SerializeToString())


def test_the_facade_gives_every_public_name_from_its_module() -> None:
    """``xsp.core.otlp`` loads each name on first use from the module that holds it."""
    for name in otlp.__all__:
        value = getattr(otlp, name)
        if isinstance(value, type) or inspect.isfunction(value):  # not a constant or an alias
            assert value.__module__.startswith("xsp.core.otlp."), name
    with pytest.raises(AttributeError):
        otlp.no_such_name  # noqa: B018
