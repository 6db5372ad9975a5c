"""The collector: OTLP in over HTTP (protobuf, JSON) and gRPC, the run store out."""

from __future__ import annotations

import gzip
import json
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.fixtures import free_ports, http_collector, load_raw, start_collector
from xsp.collector.server import Collector, CollectorConfig, rpc_status
from xsp.core import otlp, schema
from xsp.core.store import open_measurement
from xsp.tracer.convert.spans import build_table
from xsp.tracer.export import otlp_layout

ROOT = Path(__file__).resolve().parents[1]


def _table(run_id: str) -> pa.Table:
    steps, framework, _ = load_raw("resnet18_train_cpu")
    return build_table(run_id, "MF", {"M": steps, "F": framework})[0]


def _resource(run_id: str, levels: str = "MF") -> dict[str, object]:
    return {
        "service.name": "xsp",
        "host.name": "h",
        schema.RES_RUN_ID: run_id,
        schema.RES_MEASUREMENT_ID: f"m-{run_id}",
        schema.RES_LEVELS: levels,
    }


def _request(run_id: str) -> trace_service_pb2.ExportTraceServiceRequest:
    return otlp_layout.encode_request(_resource(run_id), _table(run_id))


@pytest.fixture
def collector(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = Collector(
        CollectorConfig(
            store=tmp_path / "store",
            grpc_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            flush_interval_s=0.05,
        )
    ).start()
    yield c
    c.stop()


def _post(
    port: int,
    body: bytes,
    content_type: str = "application/x-protobuf",
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/traces",
        data=body,
        method="POST",
        headers={"Content-Type": content_type, **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def test_http_protobuf_json_and_grpc_land_in_the_store(
    collector: Collector, tmp_path: Path
) -> None:
    assert _post(collector.http_port, _request("a").SerializeToString())[0] == 200
    as_json = json.dumps(otlp.request_to_json(_request("b"))).encode()
    assert _post(collector.http_port, as_json, "application/json")[0] == 200
    gz = gzip.compress(_request("d").SerializeToString())
    assert _post(collector.http_port, gz, headers={"Content-Encoding": "gzip"})[0] == 200
    with grpc.insecure_channel(f"127.0.0.1:{collector.grpc_port}") as channel:
        trace_service_pb2_grpc.TraceServiceStub(channel).Export(_request("c"), timeout=10)
    collector.stop()
    for run_id in "abcd":
        runs = open_measurement(tmp_path / "store" / f"m-{run_id}")
        assert [r.levels for r in runs] == ["MF"]
        stored = runs[0].spans().sort_by("span_id")
        original = _table(run_id).sort_by("span_id")
        assert stored.num_rows == original.num_rows == 1791
        for column in ("trace_id", "span_id", "parent_span_id", "start_ns", "dur_ns", "iteration"):
            assert stored.column(column).equals(original.column(column)), column
        # the roots' wire titles ("… · MF") are stored as the plain name
        assert stored.column("name").to_pylist() == original.column("name").to_pylist()
        assert (
            stored.column("module_path").to_pylist() == original.column("module_path").to_pylist()
        )
        assert runs[0].meta["resource"]["xsp.run.id"] == run_id
    assert collector.accepted_spans == 4 * 1791


def test_http_rejections_carry_clear_status(tmp_path: Path) -> None:
    config = CollectorConfig(
        store=tmp_path / "s",
        grpc_address=None,
        http_address="127.0.0.1:0",
        max_request_bytes=200_000,
        token="secret",
    )
    c = Collector(config).start()
    auth = {"Authorization": "Bearer secret"}
    try:
        code, body, _ = _post(c.http_port, b"\xff\xff\xff", headers=auth)
        assert code == 400 and b"not an OTLP protobuf trace request" in body
        code, body, _ = _post(
            c.http_port,
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}',
            "application/json",
            auth,
        )
        assert code == 400 and json.loads(body)["message"] == "traceId 'zz' is not hex"
        assert _post(c.http_port, b"x" * 300_000, headers=auth)[0] == 413
        assert _post(c.http_port, b"", "text/plain", auth)[0] == 415
        code, body, _ = _post(c.http_port, _request("x").SerializeToString())
        assert code == 401 and body == rpc_status(16, "missing or wrong bearer token")
        wrong = {"Authorization": "Bearer secrets"}
        assert _post(c.http_port, b"", headers=wrong)[0] == 401
        any_case = {"Authorization": "bearer secret"}  # the scheme is case-insensitive
        assert _post(c.http_port, b"", headers=any_case)[0] == 200  # an empty request
        bad_ids = trace_service_pb2.ExportTraceServiceRequest()
        bad_ids.resource_spans.add().scope_spans.add().spans.add(
            trace_id=b"short", span_id=b"12345678"
        )
        code, body, _ = _post(c.http_port, bad_ids.SerializeToString(), headers=auth)
        assert code == 400 and b"trace_id must be 16 bytes" in body
        assert (
            _post(c.http_port, _request("ok").SerializeToString()[:100_000], headers=auth)[0] == 400
        )
    finally:
        c.stop()
    busy = http_collector(tmp_path / "b", max_pending_bytes=-1)
    try:
        code, _, headers = _post(busy.http_port, _request("x").SerializeToString())
        assert code == 429 and headers["Retry-After"] == "1"
    finally:
        busy.stop()


def test_grpc_rejections(tmp_path: Path) -> None:
    c = Collector(
        CollectorConfig(
            store=tmp_path / "s",
            grpc_address="127.0.0.1:0",
            http_address=None,
            max_request_bytes=100_000,
            max_pending_bytes=10**9,
        )
    ).start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}") as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as too_big:
                stub.Export(_request("x"), timeout=10)
            assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            bad = trace_service_pb2.ExportTraceServiceRequest()
            bad.resource_spans.add().scope_spans.add().spans.add(trace_id=b"1" * 16, span_id=b"1")
            with pytest.raises(grpc.RpcError) as invalid:
                stub.Export(bad, timeout=10)
            assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "span_id must be 8 bytes" in invalid.value.details()
            c.config = CollectorConfig(store=tmp_path / "s", max_pending_bytes=-1)
            small = otlp_layout.encode_request(_resource("y"), _table("y").slice(0, 10))
            with pytest.raises(grpc.RpcError) as busy:
                stub.Export(small, timeout=10)
            assert busy.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        c.stop()


def test_many_senders_at_once_and_forwarding(tmp_path: Path) -> None:
    downstream = Collector(
        CollectorConfig(
            store=tmp_path / "down",
            grpc_address="127.0.0.1:0",
            http_address=None,
            flush_interval_s=0.05,
        )
    ).start()
    front = http_collector(
        tmp_path / "front",
        forward=f"grpc://127.0.0.1:{downstream.grpc_port}",
        flush_interval_s=0.05,
    )
    try:
        threads = [
            threading.Thread(
                target=_post, args=(front.http_port, _request(f"p{i}").SerializeToString())
            )
            for i in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        front.stop()  # flushes, and forwards, before it returns
        downstream.stop()
    assert front.accepted_spans == downstream.accepted_spans == 6 * 1791
    assert front.forward_errors == 0
    assert open_measurement(tmp_path / "down" / "m-p3")[0].spans().num_rows == 1791


def test_a_forward_endpoint_that_never_answers_holds_up_neither_the_store_nor_the_exit(
    tmp_path: Path,
) -> None:
    import socket

    hole = socket.socket()  # the kernel accepts connections to it; nothing ever answers
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    front = http_collector(
        tmp_path / "front",
        forward=f"http://127.0.0.1:{hole.getsockname()[1]}",
        flush_interval_s=0.05,
        forward_drain_s=1.0,
    )
    try:
        for i in range(3):
            assert _post(front.http_port, _request(f"h{i}").SerializeToString())[0] == 200
            run = tmp_path / "front" / f"m-h{i}" / "MF" / "run.json"  # written last
            deadline = time.monotonic() + 5
            while not run.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            # stored within the flush interval, while the first forward still hangs
            assert open_measurement(tmp_path / "front" / f"m-h{i}")[0].spans().num_rows == 1791
    finally:
        began = time.monotonic()
        front.stop()
        stopping_s = time.monotonic() - began
        hole.close()
    assert stopping_s < 3  # the drain's 1 s, not the transport's retries (about a minute)
    assert front.forward_errors == 3  # none forwarded, all stored


def test_another_senders_spans_are_stored_and_said_to_be_not_xsps(collector) -> None:  # type: ignore[no-untyped-def]
    import pyarrow.parquet as pq

    from xsp.core.errors import StoreError

    request = trace_service_pb2.ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.add(key="service.name").value.string_value = "shop"
    span = resource_spans.scope_spans.add().spans.add(name="GET /cart")
    span.trace_id, span.span_id = b"\x01" * 16, b"\x02" * 8
    span.start_time_unix_nano, span.end_time_unix_nano = 1_000, 2_000
    assert _post(collector.http_port, request.SerializeToString())[0] == 200
    collector.flush()
    run_dir = collector.config.store / "shop" / "otlp"
    assert pq.read_table(next(run_dir.glob("spans-*.parquet"))).num_rows == 1
    with pytest.raises(StoreError, match="spans of a sender that is not xsp"):
        open_measurement(collector.config.store / "shop")


def _one_span(service: str, **attributes: object) -> trace_service_pb2.ExportTraceServiceRequest:
    request = trace_service_pb2.ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.add(key="service.name").value.string_value = service
    span = resource_spans.scope_spans.add().spans.add(name=f"from {service}")
    span.trace_id, span.span_id = b"\x01" * 16, b"\x02" * 8
    span.start_time_unix_nano, span.end_time_unix_nano = 1_000, 2_000
    for key, value in attributes.items():
        kv = span.attributes.add(key=key)
        if isinstance(value, str):
            kv.value.string_value = value
        elif isinstance(value, bool):
            kv.value.bool_value = value
        else:
            assert isinstance(value, float)
            kv.value.double_value = value
    return request


def test_names_that_clean_to_the_same_directory_are_stored_apart(collector) -> None:  # type: ignore[no-untyped-def]
    import pyarrow.parquet as pq

    names = ["a_b", "a/b", "a b", ".a_b."]
    for name in names:
        assert _post(collector.http_port, _one_span(name).SerializeToString())[0] == 200
    collector.flush()
    dirs = sorted(p.name for p in collector.config.store.iterdir() if p.name != ".spool")
    assert len(dirs) == 4 and "a_b" in dirs
    assert all(d == "a_b" or d.startswith("a_b~") for d in dirs)
    stored = {
        d: pq.read_table(next((collector.config.store / d / "otlp").glob("spans-*.parquet")))
        .column("name")
        .to_pylist()
        for d in dirs
    }
    assert sorted(n for rows in stored.values() for n in rows) == sorted(f"from {n}" for n in names)
    assert stored["a_b"] == ["from a_b"]


def test_spans_that_name_no_measurement_are_kept_apart_from_one_called_unknown(collector) -> None:  # type: ignore[no-untyped-def]
    import pyarrow.parquet as pq

    anonymous = _one_span("nobody")
    del anonymous.resource_spans[0].resource.attributes[:]  # no id, run or service name
    for request in (anonymous, _one_span("unknown"), _one_span("unidentified")):
        assert _post(collector.http_port, request.SerializeToString())[0] == 200
    collector.flush()
    store = collector.config.store
    dirs = sorted(p.name for p in store.iterdir() if p.name != ".spool")
    assert dirs == ["unidentified", "unknown", "~unidentified"]

    def names(directory: str) -> list[str]:
        part = next((store / directory / "otlp").glob("spans-*.parquet"))
        return list(pq.read_table(part).column("name").to_pylist())

    assert names("~unidentified") == ["from nobody"]
    assert names("unknown") == ["from unknown"]


def test_spans_that_would_be_stored_altered_are_refused_with_the_field_named(collector) -> None:  # type: ignore[no-untyped-def]
    backwards = _one_span("shop")
    span = backwards.resource_spans[0].scope_spans[0].spans[0]
    span.start_time_unix_nano, span.end_time_unix_nano = 5_000, 1_000
    cases = [
        (backwards, "end_time_unix_nano 1000 is before start_time_unix_nano 5000"),
        (
            _one_span("shop", **{schema.ATTR_ITERATION: "abc"}),
            "'abc' (string_value) is not an integer",
        ),
        (
            _one_span("shop", **{schema.ATTR_ITERATION: 7.9}),
            "'7.9' (double_value) is not an integer",
        ),
        (
            _one_span("shop", **{schema.ATTR_ITERATION: True}),
            "'True' (bool_value) is not an integer",
        ),
    ]
    for request, message in cases:
        for body, content_type in (
            (request.SerializeToString(), "application/x-protobuf"),
            (json.dumps(otlp.request_to_json(request)).encode(), "application/json"),
        ):
            code, answer, _ = _post(collector.http_port, body, content_type)
            assert code == 400 and message in answer.decode(errors="replace"), (
                content_type,
                answer,
            )
    # a numeric string is still read as its number
    request = _one_span("shop", **{schema.ATTR_ITERATION: "7"})
    assert _post(collector.http_port, request.SerializeToString())[0] == 200
    collector.flush()
    assert collector.accepted_spans == 1


def test_kill_during_load_loses_no_acknowledged_span(tmp_path: Path) -> None:
    store, (port,) = tmp_path / "store", free_ports(1)
    proc = start_collector(store, port)
    base = _table("k").slice(0, 200)
    acked: list[bytes] = []
    stop = threading.Event()

    def load() -> None:
        i = 0
        while not stop.is_set():
            trace_id = i.to_bytes(16, "big")
            table = base.set_column(
                0, "trace_id", pa.array([trace_id] * base.num_rows, pa.binary(16))
            )
            body = otlp_layout.encode_request(_resource("k"), table).SerializeToString()
            try:
                if _post(port, body)[0] == 200:
                    acked.append(trace_id)
            except OSError:
                return
            i += 1

    sender = threading.Thread(target=load)
    sender.start()
    while len(acked) < 40:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stop.set()
    sender.join()
    restarted = start_collector(store, port)
    restarted.send_signal(signal.SIGTERM)
    assert restarted.wait(timeout=30) == 0
    spans = open_measurement(store / "m-k")[0].spans()
    stored = set(spans.column("trace_id").to_pylist())
    assert set(acked) <= stored
    assert spans.num_rows >= len(acked) * 200


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_protobuf_decoder_never_crashes(body: bytes) -> None:
    try:
        request = otlp.parse_protobuf(body)
        otlp.validate(request)
        for resource_spans in request.resource_spans:
            otlp.table_from_resource_spans(resource_spans)
    except otlp.DecodeError:
        pass


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
_span_keys = st.sampled_from(
    ["traceId", "spanId", "parentSpanId", "name", "startTimeUnixNano", "attributes", "kind"]
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        _json_values,
        st.fixed_dictionaries(
            {
                "resourceSpans": st.lists(
                    st.fixed_dictionaries(
                        {
                            "scopeSpans": st.lists(
                                st.fixed_dictionaries(
                                    {
                                        "spans": st.lists(
                                            st.dictionaries(_span_keys, _json_values, max_size=5),
                                            max_size=3,
                                        )
                                    }
                                ),
                                max_size=2,
                            )
                        }
                    ),
                    max_size=2,
                )
            }
        ),
    )
)
def test_json_decoder_never_crashes(data: object) -> None:
    try:
        request = otlp.parse_json(json.dumps(data).encode())
        otlp.validate(request)
        for resource_spans in request.resource_spans:
            otlp.table_from_resource_spans(resource_spans)
    except otlp.DecodeError:
        pass


def test_sigterm_stores_everything_acknowledged_through_the_worker_process(tmp_path: Path) -> None:
    """`xsp collector serve` converts in a worker process; stopping must store every spooled
    request before it exits, with nothing left in the spool for a next start."""
    store, (port,) = tmp_path / "store", free_ports(1)
    proc = start_collector(store, port)
    base = _table("w").slice(0, 300)
    sent = []
    for i in range(40):
        trace_id = (1000 + i).to_bytes(16, "big")
        table = base.set_column(0, "trace_id", pa.array([trace_id] * base.num_rows, pa.binary(16)))
        assert (
            _post(port, otlp_layout.encode_request(_resource("w"), table).SerializeToString())[0]
            == 200
        )
        sent.append(trace_id)
        if i == 20:
            time.sleep(1.0)  # a flush in between: the worker process is running
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    spans = open_measurement(store / "m-w")[0].spans()
    assert spans.num_rows == 40 * 300
    assert set(spans.column("trace_id").to_pylist()) == set(sent)
    assert not list((store / ".spool").glob("seg-*"))


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_store_worker_ends_with_a_killed_collector(tmp_path: Path) -> None:
    """kill -9 leaves the collector's worker process an orphan: it must not linger (each one
    holds ~150 MB) but end by itself."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("needs /proc (Linux) to find the worker process")
    store, (port,) = tmp_path / "store", free_ports(1)
    proc = start_collector(store, port)
    base = _table("o")
    deadline = time.time() + 30
    i = 0
    # keep the worker busy, so that it is orphaned mid-conversion, as under load
    while time.time() < deadline:
        trace = pa.array([i.to_bytes(16, "big")] * base.num_rows, pa.binary(16))
        body = otlp_layout.encode_request(_resource("o"), base.set_column(0, "trace_id", trace))
        assert _post(port, body.SerializeToString())[0] == 200
        i += 1
        workers = _children(proc.pid)
        if workers and i >= 60:
            break
    assert workers, "the collector started no worker process"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while any(_alive(w) for w in workers) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(_alive(w) for w in workers)
