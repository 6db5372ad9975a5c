"""The store worker's column-wise decoding (``otlp_columns``) stores what the span-by-span
decoder (``otlp.table_from_resource_spans``) stores, for xsp's requests and any other."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.fixtures import varied_xsp_table
from xsp.collector import writer
from xsp.core import otlp
from xsp.core.otlp import columns as otlp_columns
from xsp.tracer.export import otlp_layout

RESOURCE = {"service.name": "xsp", "xsp.measurement.id": "m1", "xsp.levels": "MF"}


@pytest.fixture(scope="module")
def xsp_table() -> pa.Table:
    return varied_xsp_table()


def _both(body: bytes) -> tuple[writer.Converted, writer.Converted]:
    return (
        writer.convert(otlp_columns.parse_request(body)),
        writer.convert(otlp.parse_protobuf(body)),
    )


def _assert_same(column_wise: writer.Converted, span_by_span: writer.Converted) -> None:
    assert len(column_wise) == len(span_by_span)
    for (key, sender, table), (key2, sender2, table2) in zip(
        column_wise, span_by_span, strict=True
    ):
        assert (key, sender) == (key2, sender2)
        assert table.schema == table2.schema
        for name in table.column_names:
            assert table.column(name).equals(table2.column(name)), name


def test_xsp_spans_are_decoded_column_wise_into_the_same_table(xsp_table: pa.Table) -> None:
    body = otlp_layout.encode_request(RESOURCE, xsp_table).SerializeToString()
    mirror = otlp_columns.parse_request(body)
    spans, _ = otlp.spans_and_scopes(mirror.resource_spans[0])
    assert otlp_columns.common_columns(spans) is not None  # the column-wise path ran
    column_wise, span_by_span = _both(body)
    _assert_same(column_wise, span_by_span)
    stored = column_wise[0][2]
    assert stored.num_rows == 400
    step = stored.column("kind").to_pylist().index("step")
    assert stored.column("name")[step].as_py() == "step"  # the wire title back to its name
    assert stored.column("parent_span_id")[step].as_py() == 0
    assert stored.column("remote_parent_span_id")[step].as_py() == 0xABCDEF0123456789
    assert stored.column("gpu_utilization_pct")[step].as_py() == 87.5
    assert stored.column("thread_id").to_pylist().count(-5) == 1
    assert stored.column("link_span_id").to_pylist().count(0x1122334455667788) == 1
    assert (
        pa.compute.sum(stored.column("dur_ns")).as_py()
        == pa.compute.sum(xsp_table.column("dur_ns")).as_py()
    )


def test_another_senders_spans_fall_back_to_the_same_table(xsp_table: pa.Table) -> None:
    request = otlp_layout.encode_request(RESOURCE, xsp_table.slice(0, 50))
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[3].kind = Span.SPAN_KIND_SERVER
    spans[4].attributes.add(key="http.route", value={"string_value": "/predict"})
    spans[5].events.add(name="retry", time_unix_nano=5)
    spans[6].attributes.add(key="xsp.iteration", value={"string_value": "7"})
    column_wise, span_by_span = _both(request.SerializeToString())
    _assert_same(column_wise, span_by_span)
    stored = column_wise[0][2]
    assert stored.column("span_kind")[3].as_py() == Span.SPAN_KIND_SERVER
    assert '"/predict"' in stored.column("attributes")[4].as_py()
    assert stored.column("events")[5].as_py()[0]["name"] == "retry"
    assert stored.column("iteration")[6].as_py() == 7


def test_a_value_that_fits_no_column_is_refused_by_both(xsp_table: pa.Table) -> None:
    request = otlp_layout.encode_request(RESOURCE, xsp_table.slice(0, 20))
    span = request.resource_spans[0].scope_spans[0].spans[2]
    span.attributes.add(key="xsp.rank", value={"int_value": 1 << 40})
    body = request.SerializeToString()
    messages = []
    for parse in (otlp_columns.parse_request, otlp.parse_protobuf):
        with pytest.raises(otlp.DecodeError) as caught:
            writer.convert(parse(body))
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
    assert "xsp.rank 1099511627776 does not fit its int32 column" in messages[0]


def test_a_repeated_attribute_keeps_its_last_value_as_before(xsp_table: pa.Table) -> None:
    request = otlp_layout.encode_request(RESOURCE, xsp_table.slice(0, 20))
    span = request.resource_spans[0].scope_spans[0].spans[1]
    span.attributes.add(key="xsp.iteration", value={"int_value": 41})
    column_wise, span_by_span = _both(request.SerializeToString())
    _assert_same(column_wise, span_by_span)
    assert column_wise[0][2].column("iteration")[1].as_py() == 41
    assert np.asarray(column_wise[0][2].column("span_id")).dtype == np.uint64


def test_a_malformed_span_is_left_to_protobuf_to_name(xsp_table: pa.Table) -> None:
    request = otlp_layout.encode_request(RESOURCE, xsp_table.slice(0, 3))
    good = [s.SerializeToString() for s in request.resource_spans[0].scope_spans[0].spans]
    assert otlp_columns.common_columns(good) is not None
    for bad in (good[1][:-3], good[1] + b"\x0b", good[1] + b"\x9a\x01\x05ab"):  # cut, group, past
        assert otlp_columns.common_columns([good[0], bad, good[2]]) is None


def test_span_flags_and_dropped_counts_are_kept(xsp_table: pa.Table) -> None:
    request = otlp_layout.encode_request(RESOURCE, xsp_table.slice(0, 20))
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[2].flags = 0x100
    spans[3].dropped_attributes_count = 4
    column_wise, span_by_span = _both(request.SerializeToString())
    _assert_same(column_wise, span_by_span)
    stored = column_wise[0][2]
    assert stored.column("flags")[2].as_py() == 0x100
    assert stored.column("dropped_attributes_count")[3].as_py() == 4
