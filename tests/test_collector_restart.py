"""A restarted collector opens its receivers at once and replays a killed collector's spool in
the background, losing and duplicating nothing; idle connections are closed over gRPC as over
HTTP (issue 29)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from tests.fixtures import make_collector
from tests.test_collector import _post, _resource, _table
from xsp.collector import server
from xsp.collector.quarantine import Quarantine
from xsp.collector.spool import Spool
from xsp.core.store import open_measurement
from xsp.tracer.export import otlp_layout

SPANS = _table("x").num_rows  # 1,791 spans a request (~0.6 MB of OTLP)


def _body(run_id: str) -> bytes:
    return otlp_layout.encode_request(_resource(run_id), _table(run_id)).SerializeToString()


def _killed_spool(tmp_path: Path, run_ids: list[str]) -> list[bytes]:
    """A spool as a collector killed with SIGKILL leaves it: acknowledged requests in a segment
    that was never stored nor removed."""
    store = tmp_path / "store"
    spool = Spool(store / ".spool", Quarantine(store / ".quarantine"))
    bodies = [_body(run_id) for run_id in run_ids]
    for body in bodies:
        spool.append(body)
    spool.close()  # no rotate, no flush: the segment stays
    return bodies


def _stored(tmp_path: Path, run_id: str) -> int:
    path = tmp_path / "store" / f"m-{run_id}"
    return sum(r.spans().num_rows for r in open_measurement(path)) if path.exists() else 0


def _grpc_export(port: int, body: bytes) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        export(body, timeout=30)


def test_receivers_accept_and_acknowledge_while_the_spool_is_replayed(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The replay is held at its first segment until requests have been acknowledged over both
    protocols: they cannot have waited for it. Then everything acknowledged is stored once,
    a retry of a recovered request included."""
    recovered = _killed_spool(tmp_path, ["old0", "old1"])
    release = threading.Event()
    real_store = server.store_requests

    def held(*args: Any) -> Any:
        assert release.wait(30), "the test never released the replay"
        return real_store(*args)

    monkeypatch.setattr(server, "store_requests", held)
    c = make_collector(tmp_path).start()
    try:
        assert _post(c.http_port, _body("new-http"))[0] == 200
        _grpc_export(c.grpc_port, _body("new-grpc"))
        assert _post(c.http_port, recovered[1])[0] == 200  # a retry the crash left unanswered
        assert not c.replayed.is_set() and _stored(tmp_path, "old0") == 0
        assert c.spool.duplicates == 1  # acknowledged again, not spooled twice
    finally:
        release.set()
        assert c.replayed.wait(60)
        c.stop()
    for run_id in ("old0", "old1", "new-http", "new-grpc"):
        assert _stored(tmp_path, run_id) == SPANS, run_id
    assert c.duplicate_spans == 0 and not list((tmp_path / "store" / ".spool").iterdir())


def test_time_to_first_accept_on_a_large_spool_is_shorter_than_its_replay(tmp_path: Path) -> None:
    """Measured: start to first acknowledgement, against start to the replay's end, on a spool
    of 16 requests (~10 MB, 29k spans; it took ~3 s to replay before opening)."""
    run_ids = [f"old{i}" for i in range(16)]
    _killed_spool(tmp_path, run_ids)
    body = _body("new")
    began = time.perf_counter()
    c = make_collector(tmp_path).start()
    replayed_s: list[float] = []
    waiter = threading.Thread(
        target=lambda: c.replayed.wait(120) and replayed_s.append(time.perf_counter() - began)
    )
    waiter.start()
    try:
        assert _post(c.http_port, body)[0] == 200
        first_accept_s = time.perf_counter() - began
        waiter.join(120)
    finally:
        c.stop()
    print(f"first accept {first_accept_s:.3f} s, replay {replayed_s[0]:.3f} s")
    assert first_accept_s < replayed_s[0]
    assert [_stored(tmp_path, r) for r in [*run_ids, "new"]] == [SPANS] * 17


def test_an_unbindable_port_keeps_the_spool_for_the_next_start(tmp_path: Path) -> None:
    _killed_spool(tmp_path, ["kept"])
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        taken = f"127.0.0.1:{holder.getsockname()[1]}"
        with pytest.raises(server.ConfigError, match="cannot listen"):
            make_collector(tmp_path, grpc_address=None, http_address=taken).start()
    finally:
        holder.close()
    c = make_collector(tmp_path).start()
    c.stop()
    assert _stored(tmp_path, "kept") == SPANS


def test_idle_grpc_connections_are_closed_like_http_ones(tmp_path: Path) -> None:
    c = make_collector(tmp_path, idle_s=0.5).start()
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}")
        states: list[grpc.ChannelConnectivity] = []
        channel.subscribe(states.append, try_to_connect=False)
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        stub.Export(
            otlp_layout.encode_request(_resource("idle"), _table("idle").slice(0, 2)), timeout=30
        )
        deadline = time.time() + 10
        while states[-1:] != [grpc.ChannelConnectivity.IDLE] and time.time() < deadline:
            time.sleep(0.05)
        # the server's GOAWAY after 0.5 s without a call sends the channel from READY to IDLE
        assert grpc.ChannelConnectivity.READY in states
        assert states[-1] == grpc.ChannelConnectivity.IDLE, states
        channel.close()
        with socket.create_connection(("127.0.0.1", c.http_port)) as idle_http:
            idle_http.settimeout(10)
            assert idle_http.recv(1) == b""  # closed by the collector, not by our timeout
    finally:
        c.stop()
