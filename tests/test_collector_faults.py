"""The collector under faults: poison spans, restarts, a corrupt spool, a failing store, bad
bodies, slow or idle clients, start-up errors, and a soak with kill -9 (issue 12)."""

from __future__ import annotations

import gzip
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tests.fixtures import free_ports, make_collector, start_collector
from tests.test_collector import _post, _resource, _table
from xsp.collector.spool import Spool
from xsp.core import otlp
from xsp.core.errors import StoreError
from xsp.core.store import open_measurement, read_json
from xsp.tracer.export import otlp_layout

ROOT = Path(__file__).resolve().parents[1]
Request = trace_service_pb2.ExportTraceServiceRequest


def _small(run_id: str, rows: int, first: int = 0) -> Request:
    table = _table(run_id).slice(first, rows)
    return otlp_layout.encode_request(_resource(run_id), table)


def _poison(kind: str) -> Request:
    request = _small("p", 2)
    span = request.resource_spans[0].scope_spans[0].spans[1]
    if kind == "start":
        span.start_time_unix_nano = 2**64 - 1
    elif kind == "end":
        span.end_time_unix_nano = 2**64 - 1
    else:
        key, value = {
            "iteration": ("xsp.iteration", AnyValue(int_value=2**40)),
            "thread": ("thread.id", AnyValue(double_value=float("inf"))),
            "params": ("xsp.module.params", AnyValue(string_value="1" * 30)),
        }[kind]
        del span.attributes[:]
        span.attributes.append(KeyValue(key=key, value=value))
    return request


def _stored(store: Path, measurement: str) -> int:
    path = store / measurement
    if not path.exists():
        return 0
    return sum(r.spans().num_rows for r in open_measurement(path))


# -- 1. one poison span ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "named"),
    [
        ("start", "start_time_unix_nano 18446744073709551615"),
        ("end", "end_time_unix_nano 18446744073709551615"),
        ("iteration", "xsp.iteration 1099511627776 does not fit its int32"),
        ("thread", "thread.id inf is not a finite number"),
        ("params", "xsp.module.params 111111111111111111111111111111 does not fit its int64"),
    ],
)
def test_poison_span_is_refused_at_ingest(tmp_path: Path, kind: str, named: str) -> None:
    c = make_collector(tmp_path).start()
    try:
        body = _poison(kind).SerializeToString()
        code, reply, _ = _post(c.http_port, body)
        assert code == 400 and named in reply.decode(errors="replace")
        as_json = json.dumps(otlp.request_to_json(_poison(kind))).encode()
        code, reply, _ = _post(c.http_port, as_json, "application/json")
        assert code == 400 and named in json.loads(reply)["message"]
        stub_channel = grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}")
        with stub_channel as channel, pytest.raises(grpc.RpcError) as refused:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(_poison(kind), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert named in refused.value.details()
        assert _post(c.http_port, _small("ok", 5).SerializeToString())[0] == 200
    finally:
        c.stop()
    assert _stored(tmp_path / "store", "m-ok") == 5
    assert _stored(tmp_path / "store", "m-p") == 0


def test_a_request_failing_at_flush_is_quarantined_not_blocking(tmp_path: Path) -> None:
    c = make_collector(tmp_path, flush_interval_s=60)
    c.spool.append(_small("a", 4).SerializeToString())
    c.spool.append(_poison("iteration").SerializeToString())  # got past ingest somehow
    c.spool.append(_small("b", 3).SerializeToString())
    c.flush()
    assert _stored(tmp_path / "store", "m-a") == 4 and _stored(tmp_path / "store", "m-b") == 3
    assert c.quarantined_requests == 1
    (item,) = (tmp_path / "store" / ".quarantine").iterdir()
    assert Request.FromString(item.read_bytes()) == _poison("iteration")
    assert c.spool.pending_bytes == 0
    c.stop()
    # the run it was sent to says so: none of its spans stored, one request set aside
    meta = read_json(tmp_path / "store" / "m-p" / "MF" / "run.json")
    assert (meta["spans"], meta["quarantined_requests"], meta["quarantined"]) == (0, 1, [item.name])


# -- 2. restarts never overwrite stored parts ----------------------------------------------------
def test_clean_restarts_never_overwrite_stored_spans(tmp_path: Path) -> None:
    first = 0
    for rows in (10, 7, 3):
        c = make_collector(tmp_path).start()
        assert _post(c.http_port, _small("r", rows, first).SerializeToString())[0] == 200
        c.stop()
        first += rows
    assert _stored(tmp_path / "store", "m-r") == 20


# -- 3. a corrupt spool keeps what is intact -----------------------------------------------------
def _segment_of(tmp_path: Path, count: int) -> tuple[Path, list[Request]]:
    spool_dir = tmp_path / "store" / ".spool"
    spool = Spool(spool_dir, _quarantine(tmp_path))
    requests = [_small(f"s{i}", 2) for i in range(count)]
    for request in requests:
        spool.append(request.SerializeToString())
    segment = spool.rotate()
    spool.close()
    assert segment is not None
    return segment, requests


def _quarantine(tmp_path: Path) -> Any:
    from xsp.collector.quarantine import Quarantine

    return Quarantine(tmp_path / "store" / ".quarantine")


def test_a_flipped_byte_loses_only_its_record(tmp_path: Path) -> None:
    segment, requests = _segment_of(tmp_path, 10)
    data = bytearray(segment.read_bytes())
    sizes = [12 + len(r.SerializeToString()) for r in requests]
    data[sum(sizes[:2]) + 40] ^= 0xFF  # inside record 3's payload
    segment.write_bytes(bytes(data))
    c = make_collector(tmp_path).start()
    c.stop()
    stored = [_stored(tmp_path / "store", f"m-s{i}") for i in range(10)]
    assert stored == [2, 2, 0, 2, 2, 2, 2, 2, 2, 2]
    assert c.quarantine.items == 1 and c.quarantine.bytes == sizes[2]
    assert not segment.exists()


def test_random_bytes_and_stray_files_are_quarantined(tmp_path: Path) -> None:
    spool_dir = tmp_path / "store" / ".spool"
    spool_dir.mkdir(parents=True)
    garbage = os.urandom(5000)
    (spool_dir / "seg-0123456789abcdef-000001.log").write_bytes(garbage)
    (spool_dir / "seg-foo.log").write_text("not a segment")
    c = make_collector(tmp_path).start()
    assert _post(c.http_port, _small("after", 2).SerializeToString())[0] == 200
    c.stop()
    names = sorted(p.name for p in (tmp_path / "store" / ".quarantine").iterdir())
    assert names == ["seg-0123456789abcdef-000001.at0.bad", "seg-foo.log.stray"]
    bad = tmp_path / "store" / ".quarantine" / names[0]
    assert bad.read_bytes() == garbage
    assert _stored(tmp_path / "store", "m-after") == 2


# -- 4. a failed flush is retried while running -------------------------------------------------
def test_failed_flush_is_retried_with_backoff(tmp_path: Path, monkeypatch: Any) -> None:
    c = make_collector(tmp_path).start()
    real = c.writer.write
    failures = {"left": 2}

    def flaky(part: str, converted: Any) -> int:
        if failures["left"]:
            failures["left"] -= 1
            raise StoreError("disk full (injected)")
        return real(part, converted)

    monkeypatch.setattr(c.writer, "write", flaky)
    try:
        assert _post(c.http_port, _small("f", 6).SerializeToString())[0] == 200
        deadline = time.time() + 10
        while c.spool.pending_bytes and time.time() < deadline:  # removed once stored
            time.sleep(0.05)
        assert _stored(tmp_path / "store", "m-f") == 6  # while still running
        assert c.flush_failures == 2
        assert c.spool.pending_bytes == 0
    finally:
        c.stop()


# -- 5. corrupt gzip, deep JSON -------------------------------------------------------------------
def test_corrupt_gzip_deep_json_bombs_and_other_encodings_are_refused(tmp_path: Path) -> None:
    c = make_collector(tmp_path, grpc_address=None).start()
    try:
        body = bytearray(gzip.compress(_small("g", 50).SerializeToString()))
        body[len(body) // 2] ^= 0xFF
        code, reply, _ = _post(c.http_port, bytes(body), headers={"Content-Encoding": "gzip"})
        assert code == 400 and b"bad gzip body" in reply
        deep = b"[" * 100_000 + b"]" * 100_000
        code, reply, _ = _post(c.http_port, deep, "application/json")
        assert code == 400 and "nested too deeply" in json.loads(reply)["message"]
        bomb = gzip.compress(b"\0" * (c.config.max_request_bytes + 1))
        code, reply, _ = _post(c.http_port, bomb, headers={"Content-Encoding": "gzip"})
        assert code == 413 and b"inflates past the limit" in reply  # as from Content-Length
        deflated = zlib.compress(_small("z", 5).SerializeToString())
        code, reply, _ = _post(c.http_port, deflated, headers={"Content-Encoding": "deflate"})
        assert code == 415 and b"unsupported Content-Encoding 'deflate'" in reply
        assert _post(c.http_port, b"")[0] == 200  # an empty request: no spans, nothing wrong
        assert _post(c.http_port, b"", "application/json")[0] == 400  # "" is not JSON
    finally:
        c.stop()


# -- 6. gRPC: malformed bytes are INVALID_ARGUMENT ---------------------------------------------------
def _deep_protobuf(depth: int) -> bytes:
    # AnyValue.kvlist_value -> KeyValueList.values -> KeyValue.value -> AnyValue ... nested.
    value = AnyValue(int_value=1)
    for _ in range(depth):
        nested = AnyValue()
        nested.kvlist_value.values.add(key="k").value.CopyFrom(value)
        value = nested
    request = _small("d", 1)
    request.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="deep").value.CopyFrom(
        value
    )
    return request.SerializeToString()


def test_grpc_malformed_requests_are_invalid_argument(tmp_path: Path) -> None:
    c = make_collector(tmp_path, http_address=None).start()
    non_utf8 = _small("u", 1)
    good_name = non_utf8.resource_spans[0].scope_spans[0].spans[0].name.encode()
    bad = non_utf8.SerializeToString().replace(good_name, b"\xff" * len(good_name), 1)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}") as channel:
            export = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=None,
                response_deserializer=None,
            )
            for body in (b"\xff\xff\xff", bad, _deep_protobuf(200)):
                with pytest.raises(grpc.RpcError) as refused:
                    export(body, timeout=10)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, body[:20]
                assert "not an OTLP protobuf trace request" in refused.value.details()
    finally:
        c.stop()


# -- 7. the HTTP server ----------------------------------------------------------------------------
def test_a_stalled_body_times_out(tmp_path: Path) -> None:
    c = make_collector(tmp_path, grpc_address=None, read_timeout_s=1.0).start()
    try:
        with socket.create_connection(("127.0.0.1", c.http_port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                b"Content-Length: 1000\r\n\r\n" + b"\0" * 10
            )
            t0 = time.monotonic()
            reply = sock.recv(4096)
            assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 5
    finally:
        c.stop()


def test_unauthenticated_or_oversize_body_is_refused_before_it_is_read(tmp_path: Path) -> None:
    c = make_collector(
        tmp_path, grpc_address=None, token="secret", max_request_bytes=64 << 20
    ).start()
    try:
        for headers, status in (
            (b"Content-Length: 41943040\r\n", b"401"),
            (b"Authorization: Bearer secret\r\nContent-Length: 999999999\r\n", b"413"),
        ):
            with socket.create_connection(("127.0.0.1", c.http_port), timeout=5) as sock:
                sock.sendall(
                    b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/x-protobuf\r\n" + headers + b"\r\n"
                )  # and no body at all: the answer must not wait for it
                assert sock.recv(4096).split(b" ")[1] == status
    finally:
        c.stop()


def test_many_slow_and_simultaneous_clients(tmp_path: Path) -> None:
    c = make_collector(tmp_path, grpc_address=None).start()
    idle = []
    try:
        for _ in range(300):  # slow clients hold sockets, not threads
            s = socket.create_connection(("127.0.0.1", c.http_port), timeout=5)
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
            idle.append(s)
        assert threading.active_count() < 40
        latencies: list[float] = []

        def get() -> None:
            t0 = time.monotonic()
            conn = http.client.HTTPConnection("127.0.0.1", c.http_port, timeout=10)
            conn.request("GET", "/healthz")
            assert conn.getresponse().status == 200
            conn.close()
            latencies.append(time.monotonic() - t0)

        threads = [threading.Thread(target=get) for _ in range(200)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # every request was answered while 300 slow clients held their sockets (one blocked
        # behind them would have hit its 10 s timeout); how fast is a benchmark's question
        assert len(latencies) == 200
    finally:
        for s in idle:
            s.close()
        c.stop()


def test_an_idle_tls_client_does_not_block_https(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    c = make_collector(tmp_path, grpc_address=None, tls_cert=cert, tls_key=key).start()
    idle = socket.create_connection(("127.0.0.1", c.http_port))  # never says hello
    try:
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False
        conn = http.client.HTTPSConnection("127.0.0.1", c.http_port, timeout=5, context=context)
        body = _small("t", 3).SerializeToString()
        conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        idle.close()
        c.stop()


# -- 8. start-up errors are one line -----------------------------------------------------------------
def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xsp", "collector", "serve", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_port_in_use_and_unwritable_store_are_one_line(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        for flags in (["--grpc", "", "--http"], ["--http", "", "--grpc"]):
            done = _serve("--store", str(tmp_path / "s"), *flags, f"127.0.0.1:{port}")
            lines = done.stderr.strip().splitlines() + done.stdout.strip().splitlines()
            assert done.returncode == 2, done.stderr
            assert len(lines) == 1 and lines[0].startswith("xsp: error: cannot listen"), lines
    finally:
        holder.close()
    (tmp_path / "file").write_text("x")
    (port,) = free_ports(1)
    done = _serve(
        "--store", str(tmp_path / "file" / "store"), "--grpc", "", "--http", f"127.0.0.1:{port}"
    )
    lines = done.stderr.strip().splitlines() + done.stdout.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("xsp: error: cannot create the store")


# -- soak: 4 clients, kill -9 twice, poison and corrupt gzip mixed in ----------------------------------
SOAK_S = 20.0
SOAK_CLIENTS = 4
SOAK_SPANS = 20


def test_soak_with_kill_9_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    store, (port,) = tmp_path / "store", free_ports(1)
    base = _table("soak").slice(0, SOAK_SPANS)
    acked: list[set[tuple[bytes, int]]] = [set() for _ in range(SOAK_CLIENTS)]
    refused = [0] * SOAK_CLIENTS
    deadline = time.monotonic() + SOAK_S
    span_ids = base.column("span_id").to_pylist()

    def client(k: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            trace_id = (k << 64 | i).to_bytes(16, "big")
            table = base.set_column(0, "trace_id", pa.array([trace_id] * SOAK_SPANS, pa.binary(16)))
            body = otlp_layout.encode_request(_resource("soak"), table).SerializeToString()
            bad: list[tuple[bytes, dict[str, str]]] = []
            if i % 7 == 3:
                bad.append((_poison("iteration").SerializeToString(), {}))
            if i % 7 == 5:
                broken = bytearray(gzip.compress(body))
                broken[len(broken) // 2] ^= 0xFF
                bad.append((bytes(broken), {"Content-Encoding": "gzip"}))
            for payload, headers in bad:
                try:
                    if _post(port, payload, headers=headers)[0] == 400:
                        refused[k] += 1
                except OSError:
                    pass
            while True:  # retry the same request until acknowledged, as an OTLP sender does
                try:
                    if _post(port, body)[0] == 200:
                        acked[k].update((trace_id, s) for s in span_ids)
                        break
                except OSError:
                    pass
                time.sleep(0.05)
            i += 1

    proc = start_collector(store, port)
    threads = [threading.Thread(target=client, args=(k,)) for k in range(SOAK_CLIENTS)]
    for t in threads:
        t.start()
    try:
        for _ in range(2):
            time.sleep(SOAK_S / 3)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc = start_collector(store, port)
        for t in threads:
            t.join(timeout=SOAK_S + 60)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    expected = set().union(*acked)
    assert len(expected) > 200 * SOAK_SPANS  # the load really ran
    assert sum(refused) > 20  # and the bad requests were answered
    rows = pa.concat_tables(
        pq.read_table(p, columns=["trace_id", "span_id"])
        for p in sorted((store / "m-soak" / "MF").glob("spans-*.parquet"))
    )
    stored = list(
        zip(rows.column("trace_id").to_pylist(), rows.column("span_id").to_pylist(), strict=True)
    )
    assert len(stored) == len(set(stored)), "duplicates in the store"
    assert set(stored) == expected
