"""The store worker's native span decoder (``xsp.collector.span_columns``): the numpy decoder's
columns, for real spans at every level, and never a span that decoder would not take."""

from __future__ import annotations

import logging
import random
from typing import Any

import pyarrow as pa
import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tests.fixtures import damaged, fixture_table, varied_xsp_table
from xsp.collector import span_columns, writer
from xsp.core import otlp
from xsp.core.native import NativeBuildError
from xsp.core.otlp import columns as otlp_columns
from xsp.tracer.export import otlp_layout

native: Any = span_columns._native()
pytestmark = pytest.mark.skipif(native is None, reason="no C compiler: spans decode with numpy")

RESOURCE = {"service.name": "xsp", "xsp.measurement.id": "m1", "xsp.levels": "MF"}


def _spans(table: pa.Table) -> list[bytes]:
    request = otlp_layout.encode_request(RESOURCE, table)
    mirror = otlp_columns.parse_request(request.SerializeToString())
    return otlp.spans_and_scopes(mirror.resource_spans[0])[0]


def _natively(spans: list[bytes]) -> dict[str, Any] | None:
    raw = native.decode(spans)
    return None if raw is None else span_columns._columns(raw, len(spans), None)


def _assert_same(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert sorted(got) == sorted(expected)
    for name, column in expected.items():
        assert got[name].type == column.type, name
        assert got[name].equals(column), name


@pytest.mark.parametrize(
    ("scenario", "levels"),
    [
        ("resnet18_train_cpu", "MF"),
        ("resnet18_train_mflg_cuda", "MFLG"),
        ("resnet18_train_mflg_cuda_native", "MFLG"),
        ("small_cnn_compiled_default_mflg_cuda", "MFLG"),
    ],
)
def test_real_spans_decode_natively_into_the_numpy_decoders_columns(
    scenario: str, levels: str
) -> None:
    table = fixture_table(scenario, levels)
    spans = _spans(table)
    got = _natively(spans)
    assert got is not None  # the native path took every span
    expected = otlp_columns.common_columns(spans)
    assert expected is not None
    _assert_same(got, expected)
    assert got["dur_ns"].to_pylist() == table.column("dur_ns").to_pylist()
    assert len(got["kind"].dictionary) == len(set(table.column("kind").to_pylist()))


def test_errors_links_remote_parents_floats_and_long_strings_decode_the_same() -> None:
    table = varied_xsp_table()
    spans = _spans(table)
    got = _natively(spans)
    assert got is not None
    _assert_same(got, otlp_columns.common_columns(spans))  # type: ignore[arg-type]
    kinds = table.column("kind").to_pylist()
    step, op = kinds.index("step"), kinds.index("op")
    assert got["status_message"][op].as_py() == "CUDA error: out of memory"
    assert got["status_message"].null_count == len(spans) - 1
    assert got["link_span_id"][op + 1].as_py() == 0x1122334455667788
    assert got["link_trace_id"][op + 1].as_py() == b"\x07" * 16
    assert got["link_span_id"].null_count == len(spans) - 1
    assert got["remote_parent_span_id"][step].as_py() == 0xABCDEF0123456789
    assert got["name"][step].as_py() == "step"  # the wire title back to its name
    assert got["gpu_utilization_pct"][step].as_py() == 87.5
    assert got["thread_id"][op].as_py() == -5


def _damaged(damage: str) -> list[bytes]:
    request = otlp_layout.encode_request(
        RESOURCE, fixture_table("resnet18_train_cpu", "MF").slice(0, 6)
    )
    span = request.resource_spans[0].scope_spans[0].spans[3]
    if damage == "trace_state":
        span.trace_state = "k=v"
    elif damage == "event":
        span.events.add(name="retry", time_unix_nano=5)
    elif damage == "server_kind":
        span.kind = Span.SPAN_KIND_SERVER
    elif damage == "unset_with_message":
        span.status.message = "said anyway"
    elif damage == "status_ok":
        span.status.code = Status.STATUS_CODE_OK
    elif damage == "attribute_twice":
        span.attributes.add(key="xsp.iteration", value=AnyValue(int_value=41))
    elif damage == "int_past_column":
        span.attributes.add(key="xsp.rank", value=AnyValue(int_value=1 << 40))
    elif damage == "string_for_int":
        span.attributes.add(key="xsp.rank", value=AnyValue(string_value="3"))
    elif damage == "unknown_key":
        span.attributes.add(key="http.route", value=AnyValue(string_value="/predict"))
    elif damage == "two_links":
        span.links.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
        span.links.add(trace_id=b"\x03" * 16, span_id=b"\x04" * 8)
    elif damage == "link_with_state":
        span.links.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, trace_state="k=v")
    elif damage == "flags":
        span.flags = 0x100
    elif damage == "dropped":
        span.dropped_attributes_count = 4
    elif damage == "short_trace_id":
        span.trace_id = b"\x01" * 15
    elif damage == "parent_of_4_bytes":
        span.parent_span_id = b"\x05" * 4
    elif damage == "start_past_int64":
        span.start_time_unix_nano = 2**63
    spans = [s.SerializeToString() for s in request.resource_spans[0].scope_spans[0].spans]
    if damage == "name_not_utf8":  # protobuf will not serialize it
        spans[3] = spans[3].replace(span.name.encode(), b"\xff" * len(span.name), 1)
    return spans


@pytest.mark.parametrize(
    "damage",
    [
        "trace_state",
        "event",
        "server_kind",
        "unset_with_message",
        "status_ok",
        "attribute_twice",
        "int_past_column",
        "string_for_int",
        "unknown_key",
        "two_links",
        "link_with_state",
        "flags",
        "dropped",
        "short_trace_id",
        "parent_of_4_bytes",
        "start_past_int64",
        "name_not_utf8",
    ],
)
def test_a_span_outside_the_common_case_is_left_to_the_numpy_decoder(damage: str) -> None:
    spans = _damaged(damage)
    assert native.decode(spans) is None
    assert otlp_columns.common_columns(spans) is None  # then each request alone, span by span
    assert span_columns.decode(spans) is None


def test_damaged_bytes_are_never_decoded_natively_where_numpy_declines_or_differs() -> None:
    """Byte flips, cuts and insertions in real spans: whenever the native decoder answers, the
    numpy decoder gives the same columns."""
    rng = random.Random(43)
    good = _spans(varied_xsp_table().slice(0, 40))
    natively = declined = 0
    for _ in range(1500):
        spans = list(good)
        row = rng.randrange(len(spans))
        spans[row] = damaged(rng, spans[row])
        got = _natively(spans)
        expected = otlp_columns.common_columns(spans)
        if got is None:
            declined += 1
            continue
        natively += 1
        assert expected is not None, spans[row].hex()
        _assert_same(got, expected)
    assert natively > 150 and declined > 150  # both ways were taken


def test_the_store_writer_converts_the_same_with_and_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = varied_xsp_table()
    body = otlp_layout.encode_request(RESOURCE, table).SerializeToString()
    requests = [otlp_columns.parse_request(body)] * 3
    with_native = writer.convert_together(requests)
    monkeypatch.setattr(span_columns, "_native", lambda: None)
    with_numpy = writer.convert_together(requests)
    assert with_native is not None and with_numpy is not None
    for one, other in zip(with_native, with_numpy, strict=True):
        ((key, sender, stored),) = one
        ((key2, sender2, stored2),) = other
        assert (key, sender) == (key2, sender2)
        assert stored.num_rows == 400
        assert stored.equals(stored2)


def test_no_compiler_says_so_once_and_decodes_with_numpy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("XSP_NATIVE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    with pytest.raises(NativeBuildError, match="native span decoder needs a C compiler"):
        span_columns.load()
    span_columns._native.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert span_columns.prepare() is False
        assert "spans are decoded with numpy" in caplog.text
        spans = _spans(fixture_table("resnet18_train_cpu", "MF").slice(0, 10))
        decoded = span_columns.decode(spans)
        assert decoded is not None and len(decoded["span_id"]) == 10
    finally:
        span_columns._native.cache_clear()
