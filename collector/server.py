"""The OTLP receiver: gRPC and HTTP (protobuf and JSON) in, the run store (and a forward) out.

Request path (any number of tracer processes at once):
1. size check (HTTP 413 / gRPC RESOURCE_EXHAUSTED), bearer token check, backpressure check (HTTP
   429 with Retry-After / gRPC UNAVAILABLE) when the spool holds more than ``max_pending_bytes``;
2. decode and validate (HTTP 400 / gRPC INVALID_ARGUMENT with the reason);
3. append to the write-ahead spool and fsync; only then acknowledge.

A flusher thread turns spool segments into store files every ``flush_interval_s`` and forwards
their requests to ``forward`` (any OTLP endpoint, Jaeger included); segments found at start-up
(a killed collector) are replayed first, so no acknowledged span is lost.
"""

from __future__ import annotations

import gzip
import io
import logging
import ssl
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from collector.spool import Spool
from collector.writer import StoreWriter
from tracer import otlp
from tracer.errors import ConfigError, ExportError
from tracer.transport import OtlpConfig, Transport, make_transport

log = logging.getLogger(__name__)

DEFAULT_GRPC = "127.0.0.1:4317"
DEFAULT_HTTP = "127.0.0.1:4318"
DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_PENDING_BYTES = 512 * 1024 * 1024
DEFAULT_FLUSH_INTERVAL_S = 0.5
RETRY_AFTER_S = 1
TRACES_PATH = "/v1/traces"


class Busy(Exception):
    """The spool is full: the sender should retry later."""


@dataclass(frozen=True)
class CollectorConfig:
    store: Path
    grpc_address: str | None = DEFAULT_GRPC
    http_address: str | None = DEFAULT_HTTP
    forward: str | None = None
    token: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES
    flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S

    def __post_init__(self) -> None:
        if not (self.grpc_address or self.http_address):
            raise ConfigError("the collector needs --grpc or --http")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        for address in (self.grpc_address, self.http_address):
            if address is not None:
                split_address(address)


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"bad address {address!r}: use HOST:PORT, e.g. 127.0.0.1:4318")
    return host.strip("[]") or "127.0.0.1", int(port)


class Collector:
    def __init__(self, config: CollectorConfig) -> None:
        self.config = config
        self.spool = Spool(config.store / ".spool")
        self.writer = StoreWriter(config.store)
        self._forward: Transport | None = None
        if config.forward:
            forward_config = OtlpConfig.from_env(config.forward)
            assert forward_config is not None  # an explicit endpoint always yields one
            self._forward = make_transport(forward_config)
        self.accepted_spans = 0
        self.forward_errors = 0
        self._count_lock = threading.Lock()
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, name="xsp-flusher", daemon=True)
        self._http: ThreadingHTTPServer | None = None
        self._grpc: grpc.Server | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Collector:
        for segment in self.spool.recovered:  # a killed collector's acknowledged requests
            self._flush_segment(segment)
        self._flusher.start()
        if self.config.http_address:
            self._start_http(*split_address(self.config.http_address))
        if self.config.grpc_address:
            self._start_grpc(self.config.grpc_address)
        return self

    def stop(self) -> None:
        """Stop receiving, flush everything to the store, close. Safe to call twice."""
        if self._stop.is_set():
            return
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self._grpc is not None:
            self._grpc.stop(grace=2).wait()
        self._stop.set()
        self._flusher.join()
        self.flush()
        self.spool.close()
        if self._forward is not None:
            self._forward.close()

    # -- ingest --------------------------------------------------------------------------------
    def check_capacity(self) -> None:
        if self.spool.pending_bytes > self.config.max_pending_bytes:
            raise Busy(f"spool holds {self.spool.pending_bytes} bytes not yet stored")

    def ingest(self, request: trace_service_pb2.ExportTraceServiceRequest) -> int:
        """Validate and spool a request; returns the span count once it is durable."""
        spans = otlp.validate(request)
        self.check_capacity()
        self.spool.append(request.SerializeToString())
        with self._count_lock:
            self.accepted_spans += spans
        return spans

    def authorized(self, header: str | None) -> bool:
        return self.config.token is None or header == f"Bearer {self.config.token}"

    # -- flushing ------------------------------------------------------------------------------
    def _flush_loop(self) -> None:
        while not self._stop.wait(self.config.flush_interval_s):
            try:
                self.flush()
            except Exception:  # keep flushing later; the spool still holds the data
                log.exception("xsp collector: flushing the spool failed")

    def flush(self) -> None:
        segment = self.spool.rotate()
        if segment is not None:
            self._flush_segment(segment)

    def _flush_segment(self, segment: Path) -> None:
        requests = [otlp.parse_protobuf(payload) for payload in Spool.read(segment)]
        self.writer.write(f"c{segment.stem[4:]}", requests)
        if self._forward is not None:
            for request in requests:
                try:
                    self._forward.send(request)
                except ExportError as exc:
                    self.forward_errors += 1
                    log.error("xsp collector: forward failed: %s", exc)
        self.spool.remove(segment)

    # -- HTTP ----------------------------------------------------------------------------------
    def _start_http(self, host: str, port: int) -> None:
        collector = self

        class Handler(_HttpHandler):
            owner = collector

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        if self.config.tls_cert is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(self.config.tls_cert), str(self.config.tls_key))
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self._http = server
        self.http_port = server.server_address[1]
        threading.Thread(target=server.serve_forever, name="xsp-http", daemon=True).start()

    # -- gRPC ----------------------------------------------------------------------------------
    def _start_grpc(self, address: str) -> None:
        options = [
            ("grpc.max_receive_message_length", self.config.max_request_bytes),
            ("grpc.so_reuseport", 0),
        ]
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=options)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_GrpcService(self), server)
        if self.config.tls_cert is not None:
            credentials = grpc.ssl_server_credentials(
                [(Path(self.config.tls_key).read_bytes(), Path(self.config.tls_cert).read_bytes())]  # type: ignore[arg-type]
            )
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
        if port == 0:
            raise ConfigError(f"cannot bind the gRPC receiver to {address}")
        server.start()
        self._grpc = server
        self.grpc_port = port


class _GrpcService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, owner: Collector) -> None:
        self.owner = owner

    def Export(self, request: Any, context: Any) -> Any:
        metadata = dict(context.invocation_metadata())
        if not self.owner.authorized(metadata.get("authorization")):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        try:
            self.owner.ingest(request)
        except otlp.DecodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Busy as exc:
            context.set_trailing_metadata((("retry-after", str(RETRY_AFTER_S)),))
            context.abort(grpc.StatusCode.UNAVAILABLE, f"collector busy, retry later: {exc}")
        return trace_service_pb2.ExportTraceServiceResponse()


class _HttpHandler(BaseHTTPRequestHandler):
    owner: Collector
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)

    def do_GET(self) -> None:
        if self.path in ("/", "/healthz"):
            self._reply(200, b"ok\n", "text/plain")
        else:
            self._reply(404, b"not found\n", "text/plain")

    def do_POST(self) -> None:
        if self.path.split("?")[0] != TRACES_PATH:
            self._error(
                404, f"no such path {self.path!r}: OTLP traces go to {TRACES_PATH}", json_=False
            )
            return
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        as_json = content_type == "application/json"
        if content_type not in ("application/x-protobuf", "application/json"):
            self._error(415, f"unsupported Content-Type {content_type!r}", as_json, drain=True)
            return
        if not self.owner.authorized(self.headers.get("Authorization")):
            self._error(401, "missing or wrong bearer token", as_json, drain=True)
            return
        length_text = self.headers.get("Content-Length")
        if length_text is None or not length_text.isdigit():
            self._error(411, "Content-Length required", as_json)
            self.close_connection = True
            return
        length = int(length_text)
        limit = self.owner.config.max_request_bytes
        if length > limit:
            # Read and drop a moderately oversize body so the client sees the 413 rather than a
            # reset connection; past that, close without reading.
            self._discard(length if length <= 8 * limit else 0)
            self._error(413, f"request of {length} bytes exceeds the limit of {limit}", as_json)
            return
        try:
            self.owner.check_capacity()
        except Busy as exc:
            self._error(429, f"collector busy, retry later: {exc}", as_json, drain=True, retry=True)
            return
        body = self.rfile.read(length)
        try:
            if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                body = _gunzip(body, limit)
            request = otlp.parse_json(body) if as_json else otlp.parse_protobuf(body)
            self.owner.ingest(request)
        except otlp.DecodeError as exc:
            self._error(400, str(exc), as_json)
            return
        except Busy as exc:
            self._error(429, f"collector busy, retry later: {exc}", as_json, retry=True)
            return
        response = trace_service_pb2.ExportTraceServiceResponse()
        if as_json:
            self._reply(200, b"{}", "application/json")
        else:
            self._reply(200, response.SerializeToString(), "application/x-protobuf")

    def _discard(self, length: int) -> None:
        if length == 0:
            self.close_connection = True
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 20))
            if not chunk:
                break
            length -= len(chunk)

    def _error(
        self, code: int, message: str, json_: bool, drain: bool = False, retry: bool = False
    ) -> None:
        if drain:
            length_text = self.headers.get("Content-Length") or ""
            length = int(length_text) if length_text.isdigit() else 0
            self._discard(length if length <= 8 * self.owner.config.max_request_bytes else 0)
        rpc_code = _GRPC_CODE.get(code, 2)
        if json_:
            import json

            body = json.dumps({"code": rpc_code, "message": message}).encode()
            self._reply(code, body, "application/json", retry)
        else:
            self._reply(code, rpc_status(rpc_code, message), "application/x-protobuf", retry)

    def _reply(self, code: int, body: bytes, content_type: str, retry: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if retry:
            self.send_header("Retry-After", str(RETRY_AFTER_S))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


# HTTP status -> google.rpc code, for the Status message OTLP/HTTP error bodies carry.
_GRPC_CODE = {400: 3, 401: 16, 404: 5, 411: 3, 413: 8, 415: 3, 429: 14}


def rpc_status(code: int, message: str) -> bytes:
    """A serialized google.rpc.Status{code, message}: the body OTLP/HTTP gives errors (encoded
    here: two fields do not justify the googleapis-common-protos dependency)."""
    text = message.encode()
    return bytes([0x08, code]) + bytes([0x12]) + _varint(len(text)) + text


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _gunzip(body: bytes, limit: int) -> bytes:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(body)) as handle:
            data = handle.read(limit + 1)
    except (OSError, EOFError) as exc:
        raise otlp.DecodeError(f"bad gzip body: {exc}") from exc
    if len(data) > limit:
        raise otlp.DecodeError(f"gzip body inflates past the limit of {limit} bytes")
    return data


def serve(config: CollectorConfig, ready: Any = None) -> None:
    """Run until SIGINT/SIGTERM, then flush and stop."""
    import signal

    collector = Collector(config).start()
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    if ready is not None:
        ready(collector)
    while not stop.wait(1.0):
        pass
    collector.stop()
    time.sleep(0)
