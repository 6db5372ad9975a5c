"""The collector door's native check (``xsp.collector.door``): as fast as it can be on xsp's own
requests, and never accepting what the Python check (``ingest_view.check``) refuses."""

from __future__ import annotations

import random
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tests.fixtures import damaged, load_raw
from xsp.collector import door, ingest_view
from xsp.core import otlp, schema
from xsp.tracer.convert.spans import build_table
from xsp.tracer.export import otlp_layout

native: Any = door._native()
pytestmark = pytest.mark.skipif(native is None, reason="no C compiler: the door checks in Python")


def _request(rows: int | None = None) -> ExportTraceServiceRequest:
    steps, framework, _ = load_raw("resnet18_train_cpu")
    table = build_table("r", "MF", {"M": steps, "F": framework})[0]
    if rows is not None:
        table = table.slice(0, rows)
    resource = {"service.name": "xsp", schema.RES_RUN_ID: "r", schema.RES_LEVELS: "MF"}
    return otlp_layout.encode_request(resource, table)


@pytest.fixture(scope="module")
def request_() -> ExportTraceServiceRequest:
    return _request()


def test_xsps_own_request_is_counted_natively(request_: ExportTraceServiceRequest) -> None:
    body = request_.SerializeToString()
    spans = sum(len(s.spans) for r in request_.resource_spans for s in r.scope_spans)
    assert spans > 1000
    assert native.check(body) == spans == ingest_view.check(body) == door.check(body)


def _with_attribute(key: str, value: AnyValue) -> ExportTraceServiceRequest:
    request = _request(rows=3)
    span = request.resource_spans[0].scope_spans[0].spans[1]
    span.attributes.append(KeyValue(key=key, value=value))
    return request


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("xsp.iteration", AnyValue(int_value=2**40), "does not fit its int32 column"),
        ("thread.id", AnyValue(double_value=float("inf")), "thread.id inf is not a finite"),
        ("xsp.module.params", AnyValue(string_value="1" * 30), "does not fit its int64"),
        ("xsp.iteration", AnyValue(bool_value=True), "is not an integer"),
        (schema.ATTR_VIEW_STORED_PARENT, AnyValue(string_value="xyz"), "16 hex digits"),
    ],
)
def test_a_value_its_column_cannot_take_is_left_to_the_python_check(
    key: str, value: AnyValue, message: str
) -> None:
    body = _with_attribute(key, value).SerializeToString()
    assert native.check(body) == -1
    with pytest.raises(otlp.DecodeError, match=message):
        door.check(body)


def test_values_the_python_check_converts_are_still_accepted() -> None:
    """A numeric string in an integer column is stored as its number: native is not sure, the
    Python check accepts."""
    body = _with_attribute("xsp.iteration", AnyValue(string_value="7")).SerializeToString()
    assert native.check(body) == -1
    assert door.check(body) == 3


def test_a_stored_parent_and_bounded_integers_are_checked_natively() -> None:
    request = _with_attribute(schema.ATTR_VIEW_STORED_PARENT, AnyValue(string_value="0a" * 8))
    request.resource_spans[0].scope_spans[0].spans[0].attributes.append(
        KeyValue(key="xsp.iteration", value=AnyValue(int_value=-(2**31)))
    )
    assert native.check(request.SerializeToString()) == 3


@pytest.mark.parametrize(
    "damage",
    ["trace_id", "end_before_start", "start_past_int64", "link_span_id", "parent", "utf8"],
)
def test_a_span_the_python_check_refuses_is_never_accepted_natively(damage: str) -> None:
    request = _request(rows=3)
    span = request.resource_spans[0].scope_spans[0].spans[2]
    if damage == "trace_id":
        span.trace_id = b"\x01" * 15
    elif damage == "end_before_start":
        span.end_time_unix_nano = span.start_time_unix_nano - 1
    elif damage == "start_past_int64":
        span.start_time_unix_nano = span.end_time_unix_nano = 2**63
    elif damage == "link_span_id":
        span.links.add(trace_id=b"\x03" * 16, span_id=b"\x04" * 3)
    elif damage == "parent":
        span.parent_span_id = b"\x05" * 4
    body = request.SerializeToString()
    if damage == "utf8":  # a resource attribute's value; protobuf will not serialize it
        good = "host-é".encode()
        request.resource_spans[0].resource.attributes.add(
            key="h", value=AnyValue(string_value="host-é")
        )
        body = request.SerializeToString().replace(good, b"host-\xff\xfe")
    assert native.check(body) == -1
    with pytest.raises(otlp.DecodeError):
        ingest_view.check(body)


def test_damaged_bytes_are_never_accepted_where_the_python_check_refuses() -> None:
    """Byte flips, cuts and insertions in real requests: whenever the native check gives a
    count, the Python check accepts the same request with the same count."""
    rng = random.Random(31)
    bodies = [_request(rows=n).SerializeToString() for n in (1, 4, 40)]
    natively = refused = 0
    for _ in range(3000):
        body = rng.choice(bodies)
        data = damaged(rng, body, rng.randint(1, 3))
        count = native.check(data)
        try:
            expected = ingest_view.check(data)
        except otlp.DecodeError:
            refused += 1
            assert count == -1, data.hex()
            continue
        if count >= 0:
            natively += 1
            assert count == expected, data.hex()
    # both paths were exercised: some damage the Python check refuses, some the native accepts
    assert refused > 300 and natively > 300
