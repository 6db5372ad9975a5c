"""The collector at the hard limits (issue 51): a full disk under the spool, a restart while
the last one's connections are in TIME_WAIT, a health check before every receiver listens."""

from __future__ import annotations

import errno
import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tests.fixtures import make_collector, small_filesystem
from tests.test_collector import _post
from tests.test_collector_faults import _small, _stored
from xsp.collector import door, ingest_view, writer
from xsp.collector import spool as spool_module
from xsp.collector.grpc_receiver import GrpcReceiver, _probe
from xsp.collector.quarantine import Quarantine
from xsp.collector.spool import Spool, SpoolFull, read_frames
from xsp.core import otlp
from xsp.core.errors import ConfigError
from xsp.core.store import open_measurement

Request = trace_service_pb2.ExportTraceServiceRequest
#: A frame is its 12-byte header and its payload.
HEADER = 12


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a filesystem that really fills up."""
    with small_filesystem(tmp_path / "disk", 1024 * 1024) as disk:
        yield disk


def _unflushed(store: Path, **options: Any) -> Any:
    """A started collector whose spool is stored only when it stops (its flusher just waits)."""
    c = make_collector(store, spool_reserve_bytes=0, **options)
    c._flusher = threading.Thread(target=c._stop.wait, daemon=True)
    return c.start()


def _segment(store: Path) -> Path:
    (segment,) = (store / ".spool").glob("seg-*.log")
    return segment


def test_a_full_disk_acknowledges_only_whole_frames(small_disk: Path) -> None:
    # requests of 300 spans, 115 KB each: about 9 fit in 1 MiB, and one is cut short by the disk
    c = _unflushed(small_disk)
    acknowledged: list[bytes] = []
    try:
        for k in range(20):
            body = _small(f"r{k}", 300).SerializeToString()
            code, _, headers = _post(c.http_port, body)
            if code != 200:
                break
            acknowledged.append(body)
        assert (code, headers["Retry-After"]) == (503, "1")
        assert 5 <= len(acknowledged) < 10
        data = _segment(small_disk / "store").read_bytes()
        # the spool holds the acknowledged requests and not a byte of the refused one
        assert read_frames(data) == (acknowledged, [])
        assert len(data) == sum(HEADER + len(body) for body in acknowledged)
        assert c.spool_refusals == 1
    finally:
        c.stop()  # storing fails on the full disk: the segment stays, logged


def test_a_short_write_is_not_acknowledged(tmp_path: Path, monkeypatch: Any) -> None:
    c = _unflushed(tmp_path)
    try:
        first = _small("a", 4).SerializeToString()
        assert _post(c.http_port, first)[0] == 200
        real_write = os.write
        room = [100]  # the disk takes 100 more bytes of the spool's file, then none

        def short(fd: int, data: Any) -> int:
            if fd != c.spool._file.fileno():
                return real_write(fd, data)
            if room[0] == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            count = real_write(fd, bytes(data[: room[0]]))
            room[0] -= count
            return count

        monkeypatch.setattr(spool_module.os, "write", short)
        refused = _small("b", 3)
        code, reply, headers = _post(c.http_port, refused.SerializeToString())
        assert (code, headers["Retry-After"]) == (503, "1")
        assert b"No space left on device" in reply
        room[0] = 100
        channel = grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}")
        with channel, pytest.raises(grpc.RpcError) as failed:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(refused, timeout=10)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        data = _segment(tmp_path / "store").read_bytes()
        assert read_frames(data) == ([first], [])  # both partial frames were cut off again
        assert len(data) == HEADER + len(first)
        monkeypatch.undo()
        assert _post(c.http_port, refused.SerializeToString())[0] == 200  # the retry
    finally:
        c.stop()
    assert (c.accepted_spans, c.spool_refusals) == (4 + 3, 2)
    assert _stored(tmp_path / "store", "m-a") == 4 and _stored(tmp_path / "store", "m-b") == 3
    assert c.quarantine.items == 0


def test_the_spool_keeps_room_for_the_store(tmp_path: Path) -> None:
    # no disk here has 2**62 bytes free: every request would eat into the reserve
    spool = Spool(tmp_path / "spool", Quarantine(tmp_path / "q"), reserve_bytes=2**62)
    with pytest.raises(SpoolFull, match="kept for the store"):
        spool.append(b"x" * 10)
    assert spool._path.stat().st_size == 0 and spool.pending_bytes == 0
    assert spool_module.DEFAULT_RESERVE_BYTES == 64 * 1024 * 1024
    c = make_collector(tmp_path / "c", spool_reserve_bytes=2**62).start()
    try:
        code, reply, _ = _post(c.http_port, _small("a", 4).SerializeToString())
        assert code == 503 and b"kept for the store" in reply
    finally:
        c.stop()
    assert _stored(tmp_path / "c" / "store", "m-a") == 0


# -- a restart while the stopped collector's connections are in TIME_WAIT ----------------------
def test_the_grpc_probe_binds_beside_connections_in_time_wait() -> None:
    listener = socket.socket()
    # as gRPC listens (Linux lets a bind beside a TIME_WAIT connection only where both say so)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the server's side closes first: its end of the connection sits in TIME_WAIT
    client.close()
    listener.close()
    assert _time_wait(port)
    plain = socket.socket()  # what the probe did: a bind without SO_REUSEADDR is refused
    with plain, pytest.raises(OSError, match="Address already in use"):
        plain.bind(("127.0.0.1", port))
    started = time.monotonic()
    _probe(f"127.0.0.1:{port}")  # at once, as gRPC's own bind
    receiver = GrpcReceiver(
        f"127.0.0.1:{port}", ingest=len, authorized=lambda _: True, max_request_bytes=1 << 20
    )
    receiver.start()
    receiver.stop(grace_s=0)
    assert time.monotonic() - started < 5
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    with busy, pytest.raises(ConfigError, match="Address already in use"):
        _probe(f"127.0.0.1:{busy.getsockname()[1]}")  # a listener still holds its port


def _time_wait(port: int) -> bool:
    """Whether a TCP connection of local port ``port`` is in TIME_WAIT (state 06 of
    /proc/net/tcp)."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return any(
        int(row.split()[1].split(":")[1], 16) == port and row.split()[3] == "06" for row in rows
    )


def test_healthz_answers_once_every_receiver_listens(tmp_path: Path, monkeypatch: Any) -> None:
    opened = threading.Event()
    start_grpc = GrpcReceiver.start

    def slow_start(receiver: GrpcReceiver) -> None:
        opened.wait(10)
        start_grpc(receiver)

    monkeypatch.setattr(GrpcReceiver, "start", slow_start)
    c = make_collector(tmp_path)
    starting = threading.Thread(target=c.start)
    starting.start()
    try:
        while c.http_port is None:  # HTTP listens; gRPC waits for ``opened``
            time.sleep(0.01)
        assert _health(c.http_port) == (503, "1")
        opened.set()
        starting.join(10)
        assert _health(c.http_port) == (200, None)
    finally:
        opened.set()
        starting.join(10)
        c.stop()


def _health(port: int) -> tuple[int, str | None]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        return response.status, response.getheader("Retry-After")
    finally:
        conn.close()


# -- a key twice in a span: the last value, at the door and in the store ------------------------
def _twice(first: AnyValue, last: AnyValue) -> Request:
    """Three of xsp's spans, the second with xsp.iteration twice: ``first``, then ``last``."""
    request = _small("twice", 3)
    span = request.resource_spans[0].scope_spans[0].spans[1]
    span.attributes.append(KeyValue(key="xsp.iteration", value=first))
    span.attributes.append(KeyValue(key="xsp.iteration", value=last))
    return request


def test_a_key_twice_in_a_span_keeps_its_last_value(tmp_path: Path) -> None:
    abc, seven = AnyValue(string_value="abc"), AnyValue(int_value=7)
    accepted = _twice(abc, seven)
    assert door.check(accepted.SerializeToString()) == 3 == otlp.validate(accepted)
    assert ingest_view.check(accepted.SerializeToString()) == 3
    ((_, _, table),) = writer.convert(accepted)  # the store worker's span-by-span decoder
    assert table.column("iteration").to_pylist()[1] == 7
    c = make_collector(tmp_path)
    c.start()
    try:
        assert _post(c.http_port, accepted.SerializeToString())[0] == 200
        as_json = json.dumps(otlp.request_to_json(_twice(seven, abc))).encode()
        code, reply, _ = _post(c.http_port, as_json, "application/json")
        assert code == 400 and "xsp.iteration 'abc'" in json.loads(reply)["message"]
    finally:
        c.stop()
    assert c.quarantine.items == 0 and c.quarantined_requests == 0
    (run,) = open_measurement(tmp_path / "store" / "m-twice")
    iterations = run.spans().column("iteration").to_pylist()
    # the other two spans keep the iteration they were sent with
    original = _small("twice", 3).resource_spans[0].scope_spans[0].spans
    sent = [
        dict((kv.key, kv.value.int_value) for kv in s.attributes)["xsp.iteration"] for s in original
    ]
    assert iterations == [sent[0], 7, sent[2]]


def test_grpc_holds_as_many_bodies_at_once_as_http() -> None:
    """Calls beyond INFLIGHT_REQUESTS at once are refused before their body is read, as HTTP
    answers 429 past its bytes in flight (100 concurrent 31 MiB calls took the process to 1.9 GB
    before: ``benchmarks/grpc_memory.py``)."""
    from xsp.collector.http_receiver import INFLIGHT_REQUESTS

    release, inside = threading.Event(), threading.Semaphore(0)

    def ingest(body: bytes) -> int:
        inside.release()
        release.wait(30)
        return len(body)

    receiver = GrpcReceiver(
        "127.0.0.1:0", ingest=ingest, authorized=lambda _: True, max_request_bytes=1 << 20
    )
    receiver.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{receiver.port}")
    export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
    try:
        held = [export.future(b"", timeout=30) for _ in range(INFLIGHT_REQUESTS)]
        for _ in held:
            assert inside.acquire(timeout=10)  # every one is being handled
        with pytest.raises(grpc.RpcError) as refused:
            export(b"", timeout=10)
        # UNAVAILABLE, which every OTLP sender retries: the OpenTelemetry Collector drops a
        # batch refused with RESOURCE_EXHAUSTED that carries no RetryInfo
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert ("retry-after", "1") in refused.value.trailing_metadata()
        release.set()
        assert [f.result() for f in held] == [b""] * INFLIGHT_REQUESTS
        assert export(b"", timeout=10) == b""  # room again once they are answered
    finally:
        release.set()
        channel.close()
        receiver.stop(grace_s=0)


def test_large_bodies_go_back_to_the_system() -> None:
    from xsp.collector.heap import return_large_blocks

    assert return_large_blocks()  # glibc (the test machine's and CI's)


def test_a_grpc_call_without_its_message_ingests_nothing_and_ends_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sender that cancels its call (it timed out, or exits) while the receiver waits for the
    message is gone, and a call that closes its stream without one sends no spans: neither is
    ingested (an empty request spooled, fsync and all), neither logs gRPC's "Exception calling
    application" traceback, and the next call is answered."""
    entered, send = threading.Event(), threading.Event()
    ingested: list[bytes] = []

    def authorized(_: str | None) -> bool:
        entered.set()  # the handler runs: next it reads the body, which never comes
        return True

    def body() -> Iterator[bytes]:
        send.wait(30)
        yield b""

    receiver = GrpcReceiver(
        "127.0.0.1:0",
        ingest=lambda b: ingested.append(b) or 0,
        authorized=authorized,
        max_request_bytes=1 << 20,
    )
    receiver.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{receiver.port}")
    method = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
    try:
        call = channel.stream_unary(method).future(body(), timeout=30)
        assert entered.wait(10)
        assert call.cancel()
        send.set()
        assert channel.stream_unary(method)(iter(()), timeout=10) == b""  # answered OK
        assert channel.unary_unary(method)(b"", timeout=10) == b""  # served after them
    finally:
        send.set()
        channel.close()
        receiver.stop(grace_s=5)  # waits for the handlers
    assert ingested == [b""]  # the last call's message only
    assert not [r for r in caplog.records if "Exception calling application" in r.getMessage()]
